"""Byte-level language-model batches over a text file.

The default corpus is the licence text that ships with every CPython (real human-written
prose), so the demo runs offline with nothing downloaded. Byte b becomes token b; 0 is padding.
"""
from __future__ import annotations

import pathlib
import sys
from typing import Iterator

import numpy as np


def default_corpus() -> pathlib.Path:
    candidates = [pathlib.Path(sys.base_prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "LICENSE.txt",
                  pathlib.Path(sys.base_prefix) / "LICENSE.txt"]
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(f"no Python LICENSE.txt under {sys.base_prefix}; pass a text file "
                            "with --config.data.train_files")


def byte_lm_batches(batch_size: int, length: int, seed: int = 0,
                    path: str | pathlib.Path | None = None) -> Iterator[dict]:
    """Endless random windows of ``length + 1`` bytes -> inputs / targets / weights [B, L]."""
    text = pathlib.Path(path or default_corpus()).read_bytes()
    tokens = np.frombuffer(text, np.uint8).astype(np.int32)
    tokens = tokens[tokens > 0]
    if len(tokens) <= length + 1:
        raise ValueError(f"corpus {path} has {len(tokens)} bytes, fewer than a window of "
                         f"{length + 1}; use a longer text or a shorter max_length")
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(tokens) - length - 1, batch_size)
        window = np.stack([tokens[s:s + length + 1] for s in starts])
        yield {"inputs": window[:, :-1], "targets": window[:, 1:],
               "weights": np.ones((batch_size, length), np.float32)}
