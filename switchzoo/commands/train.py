"""Train a switchzoo model; re-running the same command resumes from the newest checkpoint.

    python train.py --config=configs/demo.py --workdir=DIR [--config.num_train_steps=...]
    switchzoo-train --config=configs/demo.py --workdir=DIR      # an installed package

``--config=configs/NAME.py`` is the file in this directory when there is one, else the copy
installed with the package (switchzoo.configs).
"""
from absl import app, flags, logging
from ml_collections import config_flags

from switchzoo import cli, loop

config_flags.DEFINE_config_file("config", cli.config_path("configs/demo.py"),
                                "Run config (file.py[:variant]).")
flags.DEFINE_string("workdir", None, "Checkpoints, metrics, tokenizer and config.json go here.",
                    required=True)
flags.DEFINE_bool("verbose", False, "Show full tracebacks on errors.")
cli.define_distributed_flags()


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)   # JAX's backend probing is noise here
    cli.run(lambda: (cli.initialize_distributed(),
                     loop.train(flags.FLAGS.config, flags.FLAGS.workdir)))


def run():
    app.run(main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
    run()
