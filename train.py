"""Train a switchzoo model: python train.py --config=configs/demo.py --workdir=DIR"""
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from switchzoo import training

config_flags.DEFINE_config_file("config", "configs/demo.py", "Run config (file.py[:variant]).")
flags.DEFINE_string("workdir", None, "Where metrics (and later checkpoints) go.")
flags.DEFINE_bool("verbose", False, "Show full tracebacks on errors.")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)   # JAX's backend probing is noise here
    try:
        training.train(flags.FLAGS.config, flags.FLAGS.workdir)
    except (ValueError, KeyError, FileNotFoundError) as e:
        if flags.FLAGS.verbose:
            raise
        print(f"error: {_one_line(e)}", file=sys.stderr)
        sys.exit(2)


def _one_line(e: Exception) -> str:
    text = str(e.args[0] if e.args else e)
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":    # a repr'd message
        text = text[1:-1].replace("\\n", " ").replace("\\'", "'")
    return " ".join(text.split())


def parse_flags(argv):
    """absl's parser, with a bad --config file or override as a one-line error."""
    try:
        argv = flags.FLAGS(argv)
        flags.FLAGS.config.to_dict()         # the config file loads lazily: load it now
        return argv
    except (flags.Error, AttributeError, ValueError, TypeError, OSError) as e:
        print(f"error: bad flag: {_one_line(e)}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
