"""What data preparation can rebuild, kept by the hash of everything it was built from.

Training a SentencePiece model on the embedded corpus (~3.5 s of CPU) and reading this machine's
gettext catalogues (~3.5 s) are done again by every run that starts in a new workdir, though
the same inputs give the same bytes. ``memo.bytes_of(kind, key, build)`` keeps ``build()``'s
result for the life of the process and on disk for later ones, under ``$SWITCHZOO_CACHE/data``
(default ``~/.cache/switchzoo/data``, beside the layout search's ``layouts``;
``SWITCHZOO_CACHE=`` set empty keeps nothing on disk). The key holds every input of the
result, so a hit is the very result a rebuild would give; a cache that cannot be read or
written (a read-only home, a full disk) is passed over, never an error. A run's own workdir
copies (tokenizer.model, the corpus cache) stay what resumes read.
"""
from __future__ import annotations

import contextlib
import hashlib
import pathlib
from typing import Callable, Iterable

from switchzoo import atomic, cache

_PROCESS: dict[str, bytes] = {}


def key_of(parts: Iterable) -> str:
    """A hex digest of ``parts`` (strings or bytes), each length-prefixed so that no two
    different sequences of parts give the same stream."""
    h = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode("utf-8")
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def bytes_of(kind: str, key: str, build: Callable[[], bytes]) -> bytes:
    """``build()``, or what it returned before for the same ``kind`` and ``key``."""
    name = f"{kind}-{key}"
    if name in _PROCESS:
        return _PROCESS[name]
    folder = cache.folder("data")
    path = folder / name if folder is not None else None
    data = None
    if path is not None:
        with contextlib.suppress(OSError):
            data = path.read_bytes()
    if data is None:
        data = build()
        if path is not None:
            _store(path, data)
    _PROCESS[name] = data
    return data


def _store(path: pathlib.Path, data: bytes) -> None:
    """Written atomically (switchzoo.atomic: a reader never sees half a file); a failure to
    write leaves no file behind and is passed over."""
    with contextlib.suppress(OSError):
        with atomic.replacing(path, "wb") as f:
            f.write(data)
