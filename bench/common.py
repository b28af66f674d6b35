"""Shared by the bench scripts: the machine, best-of timing, one JSON object out.

Every script prints one JSON object (and writes it to --out when given) holding the machine,
the config and its ratios, all measured in the same process run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
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
    import jax
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    devices = jax.devices()
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "jax": jax.__version__, "backend": jax.default_backend(),
            "device_kind": devices[0].device_kind, "devices": len(devices)}


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


def emit(result: dict, out: str | None) -> None:
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
