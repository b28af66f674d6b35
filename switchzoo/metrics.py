"""Where training metrics go: workdir/metrics.jsonl (one JSON object per logged step, fields
in DESIGN.md), TensorBoard events, and a one-line progress bar on the terminal."""
from __future__ import annotations

import hashlib
import json
import pathlib
import sys
import time

import jax
import numpy as np


def row(step: int, metrics: dict, learning_rate: float, tokens_per_sec: float) -> dict:
    """The metrics.jsonl record of one logged step (per-layer Switch metrics as lists)."""
    out = {"step": step, "learning_rate": learning_rate, "tokens_per_sec": tokens_per_sec}
    for key, value in metrics.items():
        value = np.asarray(value)
        out[key] = value.round(5).tolist() if value.ndim else float(value)
    return out


def digest(batch: dict) -> str:
    """A fingerprint of the batch a step consumed (resumed runs must consume the same ones)."""
    h = hashlib.sha1()
    for key in sorted(batch):
        h.update(key.encode())
        h.update(np.ascontiguousarray(batch[key]).tobytes())
    return h.hexdigest()


class Writer:
    def __init__(self, workdir, total_steps: int, start_step: int = 0, stream=sys.stderr):
        self.path = pathlib.Path(workdir)
        self.total, self.start, self.stream = total_steps, start_step, stream
        self.began = time.perf_counter()
        self.active = jax.process_index() == 0      # one process writes
        if self.active:
            from tensorboardX import SummaryWriter
            self.tb = SummaryWriter(str(self.path / "tensorboard"))

    def write(self, record: dict, prefix: str = "train") -> None:
        if not self.active:
            return
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"split": prefix, **record}) + "\n")
        step = record["step"]
        for key, value in record.items():
            if key == "step" or value is None or isinstance(value, str):
                continue
            value = np.asarray(value, np.float64)
            if value.ndim == 0:
                self.tb.add_scalar(f"{prefix}/{key}", float(value), step)
            elif value.ndim == 1:                     # one value per Switch layer
                for i, v in enumerate(value):
                    self.tb.add_scalar(f"{prefix}/{key}/layer{i}", float(v), step)
        self.tb.flush()

    def progress(self, step: int, loss: float, tokens_per_sec: float) -> None:
        if not self.active:
            return
        done = step - self.start
        elapsed = time.perf_counter() - self.began
        eta = elapsed / max(done, 1) * (self.total - step)
        width = 24
        filled = int(width * step / max(self.total, 1))
        self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] step {step}/{self.total} "
                          f"loss {loss:.4f} {tokens_per_sec:,.0f} tok/s ETA {eta:,.0f}s ")
        self.stream.flush()

    def close(self) -> None:
        if not self.active:
            return
        self.stream.write("\n")
        self.tb.close()
