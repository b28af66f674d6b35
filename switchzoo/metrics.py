"""Where training metrics go: workdir/metrics.jsonl (one JSON object per logged step, fields
in docs/design.md), TensorBoard events, and a tqdm progress bar on the terminal."""
from __future__ import annotations

import json
import pathlib
import sys
import time

import jax
import numpy as np
import tqdm

from switchzoo import atomic, workdir


def row(step: int, metrics: dict, learning_rate: float, tokens_per_sec: float | None) -> dict:
    """The metrics.jsonl record of one logged step (per-layer Switch metrics as lists)."""
    out = {"step": step, "learning_rate": learning_rate, "tokens_per_sec": tokens_per_sec}
    for key, value in metrics.items():
        value = np.asarray(value)
        out[key] = value.round(5).tolist() if value.ndim else float(value)
    return out


class Throughput:
    """Target tokens per second over the steps a log row covers, without compile or eval time:
    ``add`` each step's token count (a device scalar: no sync), ``restart`` after anything that
    is not training (it waits for the state, then starts a new interval), ``rate`` at a log
    step (None when the interval holds no step)."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.restart()

    def add(self, tokens) -> None:
        self.tokens, self.steps = self.tokens + tokens, self.steps + 1

    def restart(self, wait_for=None) -> None:
        if wait_for is not None:
            jax.block_until_ready(wait_for)
        self.tokens, self.steps, self.start = 0.0, 0, self.clock()

    def rate(self) -> float | None:
        """Tokens per second since the last restart (call after the step's metrics are read,
        so the steps have run); then restarts."""
        tokens, steps, seconds = float(self.tokens), self.steps, self.clock() - self.start
        self.restart()
        return tokens / seconds if steps and seconds > 0 else None


def summary_writer(path, purge_step: int | None = None):
    """tensorboardX's SummaryWriter, imported without torch: where torch is installed,
    tensorboardX imports it for an isinstance check we never need (we log floats), which cost
    every train.py process ~1.8 s and ~300 MB here."""
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None          # `import torch` raises ImportError meanwhile
    try:
        from tensorboardX import SummaryWriter
    finally:
        if hide:
            del sys.modules["torch"]
    # purge_step: TensorBoard drops the earlier files' events from that step on (a resume's
    # replayed steps)
    return SummaryWriter(str(path), purge_step=purge_step)


METRICS_FILE = "metrics.jsonl"


def mend_cut_line(path: pathlib.Path, stream=sys.stderr) -> None:
    """A metrics.jsonl whose last line a crash cut (no newline at its end): that row is lost
    (read_rows skips it), said in one line, and a newline ends it, so the next row starts on a
    line of its own."""
    try:
        with open(path, "rb") as f:
            f.seek(-1, 2)
            if f.read(1) == b"\n":
                return
    except (FileNotFoundError, OSError):       # no file, or an empty one
        return
    print(f"warning: the last line of {path} was cut (the run stopped while writing it); it is "
          "ignored and logging goes on from the next line", file=stream)
    with open(path, "a") as f:
        f.write("\n")


def drop_replayed(path: pathlib.Path, step: int) -> int:
    """Removes the rows of steps after ``step`` (the checkpoint a run resumes from): steps a
    crashed run logged but whose checkpoint never committed are trained again, and each step
    is recorded once, as the replay logs it; the rows replaced are appended to
    metrics-replaced-after-STEP.jsonl beside it. Returns how many rows went."""
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines(keepends=True)
    kept, dropped = [], []
    for line in lines:
        try:
            row_step = json.loads(line).get("step", 0)
        except (json.JSONDecodeError, AttributeError):
            row_step = 0                    # a cut line: read_rows skips it anyway
        (kept if row_step <= step else dropped).append(line)
    if dropped:                     # kept beside, never lost: the abandoned steps' rows
        with open(path.with_name(f"metrics-replaced-after-{step}.jsonl"), "a") as f:
            f.write("".join(dropped))
        atomic.write_text(path, "".join(kept))
    return len(lines) - len(kept)


def read_rows(path) -> list[dict]:
    """The rows of a metrics.jsonl, without a line a crash cut (mend_cut_line)."""
    rows = []
    for line in pathlib.Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


# Fields of a row that are bookkeeping, not curves (the batch fingerprints: switchzoo.hosts).
NOT_PLOTTED = ("step", "batch_sha1", "shard_sha1", "shard_process")


class Writer:
    """metrics.jsonl, TensorBoard and the progress bar of one run; only process 0 writes."""

    def __init__(self, workdir, total_steps: int, start_step: int = 0, stream=None):
        self.path = pathlib.Path(workdir)
        stream = stream or sys.stderr               # the one at the time (a test's capture)
        self.active = jax.process_index() == 0      # one process writes
        if self.active:             # before the bar: the warning gets a line of its own
            mend_cut_line(self.path / METRICS_FILE, stream)
            drop_replayed(self.path / METRICS_FILE, start_step)
        # Steps, ETA from the steps run in this process (resumed ones excluded), loss, tok/s.
        self.bar = tqdm.tqdm(total=total_steps, initial=start_step, unit="step", file=stream,
                             disable=not self.active, dynamic_ncols=True, leave=True,
                             bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}"
                                        "{postfix}]")
        if self.active:
            self.tb = summary_writer(self.path / "tensorboard",
                                     purge_step=start_step + 1 if start_step else None)

    def write(self, record: dict, prefix: str = "train") -> None:
        if not self.active:
            return
        # the whole line or, on a full disk, none of it (a one-line error)
        atomic.append(self.path / METRICS_FILE, json.dumps({"split": prefix, **record}) + "\n")
        step = record["step"]
        for key, value in record.items():
            if key in NOT_PLOTTED or value is None or isinstance(value, str):
                continue
            if isinstance(value, dict):               # a fine-tune's {task: {score: value}}
                for task, got in value.items():
                    for name, v in got.items():
                        if isinstance(v, (int, float)):
                            self.tb.add_scalar(f"{prefix}/{task}/{name}", float(v), step)
                continue
            value = np.asarray(value, np.float64)
            if value.ndim == 0:
                self.tb.add_scalar(f"{prefix}/{key}", float(value), step)
            elif value.ndim == 1:                     # one value per Switch layer
                for i, v in enumerate(value):
                    self.tb.add_scalar(f"{prefix}/{key}/layer{i}", float(v), step)
        try:
            self.tb.flush()
        except OSError as e:
            raise workdir.explain(e, self.path / "tensorboard") or e from e

    def progress(self, step: int, loss: float, tokens_per_sec: float | None) -> None:
        """Moves the bar to ``step`` with the latest loss and tokens per second."""
        rate = "" if tokens_per_sec is None else f", {tokens_per_sec:,.0f} tok/s"
        self.bar.set_postfix_str(f"loss {loss:.4f}{rate}", refresh=False)
        self.bar.update(step - self.bar.n)

    def close(self) -> None:
        self.bar.close()
        if self.active:
            try:
                self.tb.close()
            except OSError:     # a full disk: the error that stopped the run says so
                pass
