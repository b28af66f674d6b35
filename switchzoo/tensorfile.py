"""The safetensors format, read and written without pickle and without loading whole files:
an 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}},
then raw little-endian tensor bytes. Tensors are memory-mapped, so reading one shard of one
tensor touches only those bytes."""
from __future__ import annotations

import json
import os
import pathlib
import struct

import ml_dtypes
import numpy as np

from switchzoo import atomic

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
          "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
          "BOOL": np.bool_}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}


class TensorFileError(ValueError):
    pass


class TensorFile:
    """One .safetensors file: ``names()``, ``shape(name)``, ``get(name)`` (a memmap view)."""

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        with open(self.path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise TensorFileError(f"{self.path}: too short to be a safetensors file")
            (n,) = struct.unpack("<Q", raw)
            size = self.path.stat().st_size
            if n > size - 8:
                raise TensorFileError(f"{self.path}: header length {n} exceeds the file "
                                      f"({size} bytes); the file is truncated or not safetensors")
            try:
                header = json.loads(f.read(n))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise TensorFileError(f"{self.path}: unreadable header ({e}); the file is "
                                      "corrupted or not safetensors") from None
        self.metadata = header.pop("__metadata__", {}) or {}
        self.header, self.data_start = header, 8 + n
        for name, info in header.items():
            begin, end = info["data_offsets"]
            if info["dtype"] not in DTYPES:
                raise TensorFileError(f"{self.path}: tensor {name} has unsupported dtype "
                                      f"{info['dtype']}")
            want = int(np.prod(info["shape"], dtype=np.int64)) * np.dtype(DTYPES[info["dtype"]]).itemsize
            if end - begin != want or self.data_start + end > size:
                raise TensorFileError(f"{self.path}: tensor {name} does not fit its bytes; the "
                                      "file is truncated or corrupted")
        self._map = None

    def names(self) -> list[str]:
        return list(self.header)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def dtype(self, name: str) -> np.dtype:
        return np.dtype(DTYPES[self.header[name]["dtype"]])

    def get(self, name: str) -> np.ndarray:
        if self._map is None:
            self._map = np.memmap(self.path, np.uint8, "r")
        begin, end = self.header[name]["data_offsets"]
        raw = self._map[self.data_start + begin:self.data_start + end]
        return raw.view(self.dtype(name)).reshape(self.shape(name))


def write(path: str | os.PathLike, specs: dict, makers: dict, metadata=None) -> None:
    """Writes tensors in name order (as Hugging Face does), one at a time: ``specs`` gives each
    name's (shape, dtype) for the header, ``makers[name]()`` its array when its turn comes.
    Atomic: a temporary file renamed into place."""
    header, offset = {}, 0
    for name in sorted(specs):
        shape, dtype = specs[name]
        if np.dtype(dtype) not in CODES:
            raise TensorFileError(f"tensor {name}: dtype {dtype} has no safetensors code")
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        header[name] = {"dtype": CODES[np.dtype(dtype)], "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    if metadata:
        header = {"__metadata__": metadata, **header}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)                       # keep tensor data 8-byte aligned
    with atomic.replacing(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in sorted(specs):
            a = np.asarray(makers[name](), order="C")    # (ascontiguousarray: 0-d -> 1-d)
            if a.shape != tuple(specs[name][0]) or a.dtype != np.dtype(specs[name][1]):
                raise TensorFileError(f"tensor {name}: made {a.shape} {a.dtype}, header says "
                                      f"{specs[name]}")
            f.write(a.tobytes())


def write_arrays(path: str | os.PathLike, tensors: dict[str, np.ndarray], metadata=None) -> None:
    """``write`` for arrays already in memory."""
    write(path, {n: (a.shape, a.dtype) for n, a in tensors.items()},
          {n: (lambda a=a: a) for n, a in tensors.items()}, metadata)
