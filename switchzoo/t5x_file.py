"""A T5X step's files: the msgpack ``checkpoint`` (flax.serialization, format version 3) and
its parameters under ``optimizer/target``, each an inline array (flax's msgpack extension) or a
tensorstore zarr array directory (its spec's ``kvstore.path``, relative to the step; gzip
chunks; float32 or bfloat16), opened up front and read only when asked for (an expert's slice
alone); and ``Tensors``, the tensorfile interface over Hugging Face names that switchzoo.t5x
maps them to. A chunk file missing from an array is an error, never zeros.
"""
from __future__ import annotations

import pathlib

import numpy as np

from switchzoo import errors

CHECKPOINT = "checkpoint"                       # the msgpack file of a T5X step directory
COPY_AGAIN = "copy the checkpoint_N directory again, whole (gsutil -m cp -r ...)"


def is_spec(x) -> bool:
    return isinstance(x, dict) and "driver" in x and "kvstore" in x


def _flatten(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and not is_spec(value):
            yield from _flatten(value, name + "/")
        else:
            yield name, value


def parameters(step: pathlib.Path) -> dict:
    """{parameter name ('encoder/layers_0/mlp/wi/kernel'): array or tensorstore spec}."""
    file = step / CHECKPOINT
    data = file.read_bytes()
    if data.lstrip().startswith(b"model_checkpoint_path"):
        raise ValueError(f"{file} is a TensorFlow checkpoint's index (Mesh TensorFlow, tf.train),"
                         " not a T5X msgpack checkpoint; convert it to Hugging Face format with "
                         "transformers' conversion scripts, or use its T5X release "
                         "(gs://t5-data/pretrained_models/t5x/...)")
    from flax import serialization
    try:
        tree = serialization.msgpack_restore(data)
    except Exception as e:  # noqa: BLE001 (msgpack and flax raise many kinds on damage)
        raise ValueError(f"{file} is not a readable T5X checkpoint (msgpack: "
                         f"{errors.one_line(e)[:200]}); it is damaged or truncated: "
                         f"{COPY_AGAIN}") from None
    target = tree.get("optimizer", {}).get("target") if isinstance(tree, dict) and isinstance(
        tree.get("optimizer"), dict) else None
    if not isinstance(target, dict):
        keys = sorted(tree) if isinstance(tree, dict) else type(tree).__name__
        raise ValueError(f"{file} holds no optimizer/target (T5X keeps the model's parameters "
                         f"there; this file has {keys}); pass a T5X training checkpoint, as "
                         "t5x/train.py writes them")
    return dict(_flatten(target))


class Zarr:
    """One parameter's zarr array in the step directory, opened (metadata read) up front."""

    def __init__(self, step: pathlib.Path, name: str, spec: dict):
        import tensorstore as ts
        file = step / CHECKPOINT
        kvstore = spec.get("kvstore") if isinstance(spec.get("kvstore"), dict) else {}
        rel = kvstore.get("path", spec.get("path"))
        if spec.get("driver") != "zarr" or not isinstance(rel, str):
            raise ValueError(f"{file}: parameter {name} is a tensorstore spec T5X does not write "
                             f"(driver {spec.get('driver')!r}, path {rel!r}; T5X writes zarr "
                             f"arrays at a path relative to the step directory): {COPY_AGAIN}")
        self.where, self.name = step / rel, name
        if not (self.where / ".zarray").is_file():
            raise FileNotFoundError(f"{self.where} is missing (or has no .zarray): {file} keeps "
                                    f"T5X parameter {name} in that zarr array directory; "
                                    f"{COPY_AGAIN}, its array directories included")
        open_spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(self.where)},
                     "fill_missing_data_reads": False}        # a lost chunk: an error, not zeros
        if "dtype" in spec:
            open_spec["dtype"] = spec["dtype"]
        try:
            self.array = ts.open(open_spec, read=True, open=True).result()
        except ValueError as e:
            raise ValueError(f"{self.where}: cannot open T5X parameter {name}'s zarr array "
                             f"({errors.one_line(e)[:200]}); {COPY_AGAIN}") from None
        self.shape = tuple(int(n) for n in self.array.shape)
        self.dtype = np.dtype(self.array.dtype.numpy_dtype)

    def read(self, index=()) -> np.ndarray:
        try:
            return np.asarray(self.array[index].read().result())
        except ValueError as e:
            why = errors.one_line(e)
            if "NOT_FOUND" in why:      # tensorstore names the chunk file by its full path
                why = "a chunk file of the array is missing"
            raise ValueError(f"{self.where}: cannot read T5X parameter {self.name} "
                             f"({why[:300]}); {COPY_AGAIN}") from None


class Inline:
    def __init__(self, array: np.ndarray):
        self.array, self.shape, self.dtype = array, tuple(array.shape), array.dtype

    def read(self, index=()) -> np.ndarray:
        return self.array[index]


class Tensors:
    """The tensorfile.TensorFile interface (names, shape, dtype, get) over Hugging Face names,
    read from a T5X checkpoint's parameters: ``entries`` {HF name: (leaf, expert index or None,
    the 2-D [in, out] shape to read a kernel as, or None for a tensor kept as it is)}."""

    def __init__(self, entries: dict):
        self.entries = entries

    def names(self) -> list[str]:
        return list(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        leaf, expert, kernel = self.entries[name]
        if kernel is not None:
            return kernel[::-1]
        return leaf.shape[1:] if expert is not None else leaf.shape

    def dtype(self, name: str) -> np.dtype:
        return self.entries[name][0].dtype

    def get(self, name: str) -> np.ndarray:
        leaf, expert, kernel = self.entries[name]
        a = leaf.read(() if expert is None else expert)
        return a.reshape(kernel).T if kernel is not None else a
