"""Errors written for the person who made the mistake: one line each. A leaf module (it imports
nothing of switchzoo), so the library and the command lines alike can use it without the library
importing a command line."""
from __future__ import annotations

import sys


def one_line(e: BaseException) -> str:
    """An exception's message on one line (a repr'd message, as KeyError gives, unquoted)."""
    text = str(e.args[0] if e.args else e)
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":    # a repr'd message
        text = text[1:-1].replace("\\n", " ").replace("\\'", "'")
    return " ".join(text.split())


def bad_flag(text: str):
    """A bad flag: 'error: bad flag: ...' on stderr, exit status 2."""
    print(f"error: bad flag: {text}", file=sys.stderr)
    sys.exit(2)
