"""Train a switchzoo model: python train.py --config=configs/demo.py --workdir=DIR"""
from absl import app, flags
from ml_collections import config_flags

from switchzoo import training

config_flags.DEFINE_config_file("config", "configs/demo.py", "Run config (file.py[:variant]).")
flags.DEFINE_string("workdir", None, "Where metrics (and later checkpoints) go.")


def main(argv):
    del argv
    training.train(flags.FLAGS.config, flags.FLAGS.workdir)


if __name__ == "__main__":
    app.run(main)
