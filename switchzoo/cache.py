"""Where switchzoo keeps what it can rebuild (the layout search's compiles, switchzoo.data.memo's
tokenizers and catalogues): ``$SWITCHZOO_CACHE``, default ``~/.cache/switchzoo``; set empty,
nothing is kept on disk."""
from __future__ import annotations

import os
import pathlib

ENV = "SWITCHZOO_CACHE"


def folder(name: str) -> pathlib.Path | None:
    """``<root>/name``, or None where ``$SWITCHZOO_CACHE`` is set empty (keep nothing)."""
    root = os.environ.get(ENV, pathlib.Path.home() / ".cache" / "switchzoo")
    return pathlib.Path(root) / name if root else None
