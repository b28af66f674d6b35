"""Shared by the bench scripts: the machine, best-of timing, one JSON object out.

Every script prints one JSON object (and writes it to --out when given) holding the machine,
the config and its ratios, all measured in the same process run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a clone, no install


def parser(doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="also write the JSON object to this file")
    return p


def machine() -> dict:
    """The machine of every published figure (bench/ and experiments/ JSON): CPU model, id
    and instruction-set extensions (switchzoo.machine: XLA:CPU's code depends on them), cores,
    Python, JAX and its devices, and the commit."""
    import jax

    from switchzoo import machine as machine_lib
    devices = jax.devices()
    return {**machine_lib.describe(), "python": platform.python_version(),
            "jax": jax.__version__, "backend": jax.default_backend(),
            "device_kind": devices[0].device_kind, "devices": len(devices),
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""), **source()}


def source() -> dict:
    """The commit the benchmark ran (and whether tracked files differed from it), so that a
    published figure can be re-measured from the same tree."""
    root = Path(__file__).resolve().parents[1]

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    commit = git("rev-parse", "HEAD")
    if not commit:
        return {"commit": None, "tree_clean": None}
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "tree_clean": dirty == ""}


def best_of(fn, repeats: int = 5, warmup: int = 1) -> float:
    """Best wall seconds of ``fn()`` (which must block until its work is done)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def interleaved_best(fns, repeats: int, warmup: int, already_warm=None) -> list[float]:
    """Best seconds of each function, timed in alternating rounds (a, b, a, b, ...) so that both
    sides see the same background load on a shared machine."""
    for fn, done in zip(fns, already_warm or (0,) * len(fns)):
        for _ in range(max(warmup - done, 0)):
            fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], best_of(fn, repeats=1, warmup=0))
    return best


def emit(result: dict, out: str | None) -> None:
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")


class Step:
    """The real jitted train step (switchzoo.steps) of ``cfg`` on ``devices`` under a layout,
    on a random batch (or ``host_batch``): compile time, best step time, cost and memory analysis."""

    def __init__(self, cfg, mesh: str, layout: str, batch: int, length: int, devices=None,
                 optimizer: str = "adamw", host_batch: dict | None = None, compiles: int = 1,
                 loss_chunk: int = 0):
        import jax
        import numpy as np

        from switchzoo import state as state_lib
        from switchzoo import steps
        self.cfg, self.batch, self.length = cfg, batch, length
        setup = state_lib.setup(cfg, layout, mesh, devices=devices, optimizer=optimizer)
        self.layout, self.state = setup.layout, setup.init()
        step = steps.make_train_step(setup, loss_chunk=loss_chunk)
        rng = np.random.default_rng(0)
        ids = lambda: rng.integers(2, cfg.vocab_size, (batch, length), dtype=np.int32)  # noqa
        host = host_batch or {"inputs": ids(), "targets": ids(),
                              "weights": np.ones((batch, length), np.float32)}
        self.data = jax.device_put(host, state_lib.batch_shardings(self.layout))
        self.compile_s = float("inf")          # best of ``compiles`` (each one from scratch)
        for _ in range(compiles):
            jax.clear_caches()                  # else a second compile is a cache hit
            start = time.perf_counter()
            self.compiled = step.lower(self.state, self.data).compile()
            self.compile_s = min(self.compile_s, time.perf_counter() - start)

    def run(self, n: int = 1):
        import jax
        for _ in range(n):
            self.state, metrics = self.compiled(self.state, self.data)
        jax.block_until_ready(self.state)
        return metrics

    def time(self, repeats: int = 5, warmup: int = 1) -> float:
        return best_of(self.run, repeats=repeats, warmup=warmup)

    def tokens(self) -> int:
        """Target tokens per step (an encoder-decoder also reads as many source tokens)."""
        return self.batch * self.length

    def cost_flops(self) -> float:
        """XLA's FLOP count of the whole step: the per-device program's times the devices."""
        analysis = self.compiled.cost_analysis()
        analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
        return float(analysis.get("flops", 0.0)) * self.layout.mesh.size

    def memory(self) -> dict:
        """Per-device bytes of the compiled step (switchzoo.inspector.memory_stats)."""
        from switchzoo.inspector import memory_stats
        return memory_stats(self.compiled)


def matmul_peak(n: int = 2048, dtype: str = "float32", repeats: int = 5) -> float:
    """FLOP/s of one large square matmul on the default device (the machine's practical peak)."""
    import jax
    import jax.numpy as jnp
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    f = jax.jit(jnp.matmul)
    seconds = best_of(lambda: f(a, b).block_until_ready(), repeats=repeats, warmup=2)
    return 2 * n ** 3 / seconds
