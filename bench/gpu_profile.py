"""Where a compiled step's device time goes: a jax.profiler trace of a few steps, every device
op attributed to its phase and model part (bench/op_kinds.classify), on CPU or GPU.

On a GPU the trace's events are kernels, named after their fusion (``loop_add_fusion_3``), or
after the library that ran them (cuBLAS ``nvjet_*``, cuDNN ``*sdpa*``/``fmha*``); XLA annotates
each launch with its HLO instruction in the ``hlo_op`` stat, except inside a CUDA graph, where
every kernel reads ``command_buffer_N`` (bench/gpu.py's profile case runs without them). So
an op is found, in this order, from a stat holding ``hlo_op=NAME`` or naming an instruction,
from the kernel's own name, or from that name with XLA's ``.``/``-`` -> ``_`` spelling undone;
what none of these finds is classed by the kernel name alone. The result says how much of the
device time each way attributed and keeps the raw kernel table and a sample of the stats, so a
failed attribution can still be read.
"""
from __future__ import annotations

import collections
import glob
import os
import re
import tempfile
import time

import op_kinds

DERIVED_LINES = ("XLA Modules", "XLA Ops", "Steps", "Framework", "Source", "XLA TraceMe",
                 "Launch Stats", "TensorFlow")
HLO_OP = re.compile(r"hlo_op=([\w.\-]+)")
LIBRARY = (("matmul", re.compile(r"gemm|xmma|nvjet|cutlass|wgmma|cublas|matmul_dq", re.I)),
           ("attention", re.compile(r"fmha|flash|cudnn|sdpa", re.I)))


def device_events(path: str):
    """(name, ns, {stat: value}) of every op the device ran: XLA:CPU's thunks or the GPU's
    kernels (the host's threads only launch them)."""
    from jax.profiler import ProfileData
    planes = list(ProfileData.from_file(path).planes)
    on_gpu = any(p.name.startswith("/device:GPU") for p in planes)
    for plane in planes:
        if on_gpu and not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            if on_gpu and line.name.startswith(DERIVED_LINES):
                continue
            if not on_gpu and not line.name.startswith("tf_XLA"):
                continue
            for e in line.events:
                if e.name.startswith(op_kinds.RUNTIME):
                    continue
                try:
                    stats = {str(k): v for k, v in e.stats}
                except (TypeError, ValueError):
                    stats = {}
                yield e.name, e.duration_ns, stats


def resolve(name: str, stats: dict, ops: dict, spelled: dict) -> tuple[str | None, str]:
    """(HLO instruction, how it was found) of one device event; (None, "kernel name")."""
    for value in map(str, stats.values()):
        m = HLO_OP.search(value)
        if m and m.group(1) in ops:
            return m.group(1), "stat hlo_op="
        if value.strip() in ops:
            return value.strip(), "stat"
    if name in ops:
        return name, "name"
    if name in spelled:
        return spelled[name], "name respelled"
    return None, "kernel name"


# XLA:CPU traces a loop or branch as an event spanning its body's ops, which are traced too
CONTAINERS = ("while", "conditional", "call")


def attribute(path: str, ops: dict, steps: int, wall_ms: float) -> dict:
    spelled = {re.sub(r"[.\-]", "_", op): op for op in ops}
    totals, count = collections.Counter(), collections.Counter()
    kernels, how = collections.Counter(), collections.Counter()
    containers, sample = collections.Counter(), []
    for name, ns, stats in device_events(path):
        ms = ns / 1e6 / steps
        op, found = resolve(name, stats, ops, spelled)
        if (ops.get(op) or ("",))[0] in CONTAINERS:   # its body's ops are events of their own
            containers[name] += ms
            continue
        phase, part, kind = op_kinds.classify(op or name, ops.get(op))
        for lib_kind, pattern in LIBRARY:            # cuBLAS, Triton GEMMs, cuDNN attention
            if pattern.search(name):
                kind, part = "matmul", ("attention" if lib_kind == "attention" else part)
        totals[phase, part, kind] += ms
        count[phase, part, kind] += 1 / steps
        kernels[name, (ops.get(op) or ("", "", False))[1][:160]] += ms
        how[found] += ms
        if len(sample) < 4:
            sample.append({"name": name, "stats": {k: str(v)[:160] for k, v in stats.items()}})
    summary = op_kinds.summarise(totals, count, wall_ms)
    device_ms = sum(how.values()) or 1.0
    summary.update(
        top_scopes=dict(list(op_kinds.by(summary, "phase", "part").items())[:15]),
        by_kind=op_kinds.by(summary, "phase", "kind"),
        top_kernels=[{"kernel": k, "op_name": o, "ms": round(v, 3)}
                     for (k, o), v in kernels.most_common(30)],
        attributed_by={k: round(v / device_ms, 3) for k, v in how.most_common()},
        containers_ms=round(sum(containers.values()), 1),
        stat_sample=sample)
    return summary


def trace(step, steps: int = 3) -> dict:
    """Attribute ``steps`` runs of a bench/common.Step (already compiled and warm)."""
    import jax
    ops = op_kinds.hlo_ops(step.compiled.as_text())
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp)
        start = time.perf_counter()
        step.run(steps)
        wall_ms = (time.perf_counter() - start) / steps * 1e3
        jax.profiler.stop_trace()
        path = sorted(glob.glob(os.path.join(tmp, "plugins/profile/*/*.xplane.pb")))[-1]
        return attribute(path, ops, steps, wall_ms)
