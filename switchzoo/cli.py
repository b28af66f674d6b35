"""What train.py and eval.py share: bad flags and bad input as one-line errors, exit code 2."""
from __future__ import annotations

import sys

from absl import flags


def one_line(e: BaseException) -> str:
    text = str(e.args[0] if e.args else e)
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":    # a repr'd message
        text = text[1:-1].replace("\\n", " ").replace("\\'", "'")
    return " ".join(text.split())


def parse_flags(argv):
    """absl's parser, with a bad --config file or override as a one-line error."""
    try:
        argv = flags.FLAGS(argv)
        if flags.FLAGS["config"].value is not None or flags.FLAGS["config"].present:
            flags.FLAGS.config.to_dict()    # the config file loads lazily: load it now
        return argv
    except (flags.Error, AttributeError, ValueError, TypeError, OSError) as e:
        print(f"error: bad flag: {one_line(e)}", file=sys.stderr)
        sys.exit(2)


def run(fn, verbose_flag: str = "verbose") -> None:
    """Calls ``fn()``; user mistakes become 'error: ...' on stderr and exit status 2."""
    try:
        fn()
    except (ValueError, KeyError, FileNotFoundError, FloatingPointError) as e:
        if flags.FLAGS[verbose_flag].value:
            raise
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)
