"""Train a switchzoo model: python train.py --config=configs/demo.py --workdir=DIR"""
import sys

from absl import app, flags
from ml_collections import config_flags

from switchzoo import training

config_flags.DEFINE_config_file("config", "configs/demo.py", "Run config (file.py[:variant]).")
flags.DEFINE_string("workdir", None, "Where metrics (and later checkpoints) go.")
flags.DEFINE_bool("verbose", False, "Show full tracebacks on errors.")


def main(argv):
    del argv
    try:
        training.train(flags.FLAGS.config, flags.FLAGS.workdir)
    except (ValueError, KeyError, FileNotFoundError) as e:
        if flags.FLAGS.verbose:
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    app.run(main)
