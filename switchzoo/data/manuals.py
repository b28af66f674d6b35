"""English prose of the GNU Texinfo manuals a machine carries (<info_dir>/*.info*.gz).

Debian installs the manuals of coreutils, grep, sed, gettext, gnupg, wget, ... (GFDL-licensed,
~4.6 MB of text on a base system). Span corruption on the embedded corpus reads them beside the
corpus's English messages, whose median is five words: paragraphs give it running text. Menus,
node headers, indices and blocks that are mostly not words (option tables, code) are dropped,
and each paragraph's lines are joined into one document.
"""
from __future__ import annotations

import gzip
import pathlib
import re

INFO_DIR = pathlib.Path("/usr/share/info")
MAX_CHARS = 4000
_WORD = re.compile(r"[A-Za-z]{2,}")
_NOT_PROSE = ("File:", "* ", "Tag Table", "Indirect:", "END-INFO", "Local Variables")


def files(info_dir: pathlib.Path = INFO_DIR) -> list[pathlib.Path]:
    return sorted(pathlib.Path(info_dir).glob("*.info*.gz"))


def paragraphs(info_dir: pathlib.Path = INFO_DIR) -> list[str]:
    """The prose paragraphs of every manual in ``info_dir`` (none if it has no manuals)."""
    return list(dict.fromkeys(p for path in files(info_dir) for p in file_paragraphs(path)))


def file_paragraphs(path: pathlib.Path) -> list[str]:
    """The prose paragraphs of one manual (a .info.gz file)."""
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
        text = f.read()
    out = []
    for node in text.split("\x1f"):
        for block in re.split(r"\n\s*\n", node):
            lines = [line.strip() for line in block.splitlines() if line.strip()]
            if not lines or lines[0].startswith(_NOT_PROSE):
                continue
            paragraph = " ".join(line for line in lines if line)
            words = _WORD.findall(paragraph)
            # prose: several words that make up most of the characters
            if len(words) >= 8 and sum(map(len, words)) >= 0.6 * len(paragraph):
                out.append(paragraph[:MAX_CHARS])
    return list(dict.fromkeys(out))
