"""Local text files: TSV ``source<TAB>target`` for translation, one text per line for LM.

Either may be gzip-compressed (recognised by its magic bytes, whatever the name). Blank lines are
skipped; every other mistake names the file (and line) and the fix.
"""
from __future__ import annotations

import gzip
import os
import pathlib
import zlib
from typing import Callable, Iterator

from switchzoo import atomic

HOLD_OUT_ONE_IN = 50     # ~2% held out for evaluation where no eval split is given
_FIX_UTF8 = "re-encode it as UTF-8 (e.g. iconv -f LATIN1 -t UTF-8 IN > OUT)"


def split_paths(spec: str) -> list[pathlib.Path]:
    return [pathlib.Path(p.strip()).expanduser() for p in spec.split(",") if p.strip()]


def _lines(path: pathlib.Path) -> Iterator[tuple[int, str]]:
    """(line number, text without the newline) of the non-blank lines."""
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist; check --config.data.train_files"
                                " / --config.data.eval_files (comma-separated paths)")
    with open(path, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    opener = gzip.open if gzipped else open
    with opener(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{number}: bytes that are not UTF-8 ({e.reason} at byte "
                                 f"{e.start}); {_FIX_UTF8}") from None
            if line.strip():
                yield number, line


def read_tsv(path: str | os.PathLike) -> list[tuple[str, str]]:
    path = pathlib.Path(path)
    pairs = []
    for number, line in _lines(path):
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(f"{path}:{number}: a translation line needs exactly one TAB "
                             f"(source<TAB>target), found {len(fields) - 1}; fix or remove it")
        pairs.append((fields[0].strip(), fields[1].strip()))
    if not pairs:
        raise ValueError(f"{path} holds no examples (empty file); give a file with one "
                         "source<TAB>target pair per line")
    return pairs


def read_texts(path: str | os.PathLike) -> list[str]:
    path = pathlib.Path(path)
    texts = [line.strip() for _, line in _lines(path)]
    if not texts:
        raise ValueError(f"{path} holds no examples (empty file); give a file with one text "
                         "per line")
    return texts


def read(spec: str, task: str) -> list:
    """All examples of the comma-separated files ``spec``, in file then line order."""
    reader = read_tsv if task == "translation" else read_texts    # LM, span corruption
    return [example for path in split_paths(spec) for example in reader(path)]


def write_tsv(path: pathlib.Path, pairs: list[tuple[str, str]]) -> None:
    """Atomically, so that a crashed run never leaves a half corpus for the next to trust."""
    atomic.write_text(path, "".join(f"{s}\t{t}\n" for s, t in pairs))


def hold_out(examples: list, key: Callable = lambda e: e if isinstance(e, str) else e[0]):
    """(train, eval): a stable ~2% by a hash of ``key``, so equal keys fall on the same side."""
    train, held = [], []
    for e in examples:
        (held if zlib.crc32(key(e).encode("utf-8")) % HOLD_OUT_ONE_IN == 0 else train).append(e)
    return train, held
