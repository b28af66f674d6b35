"""Where a training step's time goes, switchzoo (XLA:CPU) and transformers (torch) side by side.

    python bench/step_profile.py [--threads 1] [--steps 5] [--out f.json] [--trace-dir DIR]

The peer config of bench/peer.py (same weights, same batch). switchzoo's step is traced with
jax.profiler and every executed XLA op (thunk) is attributed through its HLO ``op_name``: the
phase (``jvp(...)`` forward, ``transpose(jvp(...))`` backward, else the update) and the model
part from switchzoo's named scopes (attention, relpos_bias, masks, norm, mlp, routing, dispatch,
experts, combine, embed, logits, loss, optimizer; "weight layout": copies of weights
into the layout their matmuls read). transformers' step is profiled with
torch.profiler, its three phases in record_function ranges; every leaf op's self time is put in
the same kinds (matmul, copy/layout, elementwise and reductions, optimizer). Time not inside any
op (the executor's own work between ops, Python) is its own row, so each side sums to its
step's wall time.

With 1 thread the ops run one after another and their times add up to the step; with more,
XLA runs independent ops concurrently, so op times overlap (the JSON gives both sums).
"""
from __future__ import annotations

import collections
import glob
import os
import sys
import tempfile
import time

from common import emit, machine

import gpu_profile
import peer
from op_kinds import by, hlo_ops, summarise



def build_parser():
    p = peer.build_parser()
    p.description = __doc__.strip().splitlines()[0]
    a = p.add_argument
    a("--steps", type=int, default=5, help="profiled steps per side")
    a("--trace-dir", default=None, help="keep the jax trace here (default: a temporary dir)")
    p.set_defaults(threads=1)
    return p


# ------------------------------------------------------------------------------ switchzoo

def profile_ours(step, steps: int, trace_dir: str) -> dict:
    import jax
    text = step.compiled().as_text()
    ops = hlo_ops(text)
    for _ in range(3):
        step()
    jax.profiler.start_trace(trace_dir)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    wall = (time.perf_counter() - start) / steps
    jax.profiler.stop_trace()
    path = sorted(glob.glob(os.path.join(trace_dir, "plugins/profile/*/*.xplane.pb")))[-1]
    return gpu_profile.attribute(path, ops, steps, wall * 1e3)


# ------------------------------------------------------------------------------ transformers

TORCH_KINDS = (("matmul", ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm")),
               ("optimizer", ("aten::_fused_adamw", "aten::_foreach")),
               ("copy/layout", ("aten::copy_", "aten::cat", "aten::index", "aten::scatter",
                                "aten::fill_", "aten::zero_", "aten::embedding",
                                "aten::_index_put", "aten::clone", "aten::contiguous",
                                "aten::gather", "aten::masked_scatter", "aten::_to_copy",
                                "aten::where", "aten::nonzero")))


def torch_kind(name: str) -> str:
    for kind, prefixes in TORCH_KINDS:
        if name.startswith(prefixes):
            return kind
    return "elementwise/reduce"


def profile_theirs(step, steps: int) -> dict:
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        step()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    wall = (time.perf_counter() - start) / steps
    totals, count = collections.Counter(), collections.Counter()
    for e in prof.events():
        if e.self_cpu_time_total <= 0 or not e.name.startswith("aten::"):
            continue
        phase, parent = "other", e.cpu_parent
        while parent is not None:
            if parent.name in ("forward", "backward", "optimizer"):
                phase = "update" if parent.name == "optimizer" else parent.name
            parent = parent.cpu_parent
        key = (phase, "-", torch_kind(e.name))
        totals[key] += e.self_cpu_time_total / 1e3 / steps
        count[key] += 1 / steps
    return summarise(totals, count, wall * 1e3)


# ------------------------------------------------------------------------------ both

def table(result: dict) -> str:
    ours, theirs = result["switchzoo"], result["transformers"]
    a, b = by(ours, "phase", "kind"), by(theirs, "phase", "kind")
    lines = ["| phase / kind | switchzoo ms | transformers ms |", "|---|---:|---:|"]
    for key in sorted(set(a) | set(b), key=lambda k: -(a.get(k, 0) + b.get(k, 0))):
        lines.append(f"| {key} | {a.get(key, 0):.1f} | {b.get(key, 0):.1f} |")
    lines.append(f"| outside ops (executor, Python) | {ours['outside_ops_ms']:.1f} | "
                 f"{theirs['outside_ops_ms']:.1f} |")
    lines.append(f"| **step** | **{ours['step_ms']:.1f}** | **{theirs['step_ms']:.1f}** |")
    lines += ["", "| switchzoo part (phase) | matmul ms | other ms |", "|---|---:|---:|"]
    parts = collections.defaultdict(lambda: [0.0, 0.0])
    for r in ours["rows"]:
        parts[f"{r['part']} ({r['phase']})"][r["kind"] != "matmul"] += r["ms"]
    for key, (mm, other) in sorted(parts.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"| {key} | {mm:.1f} | {other:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    allowed = os.sched_getaffinity(0)
    threads = args.threads or len(allowed)
    thread_note = peer.limit_threads(threads)
    try:
        import torch
        torch.set_num_threads(threads)
        pair = peer.Pair(args)
        with tempfile.TemporaryDirectory() as tmp:
            ours = profile_ours(pair.ours_train_step(), args.steps, args.trace_dir or tmp)
        theirs = profile_theirs(pair.theirs_train_step(scopes=True), args.steps)
    finally:
        os.sched_setaffinity(0, allowed)
    result = {"benchmark": "profile: one training step at the peer config, per op kind and "
                           "model part, switchzoo vs transformers",
              "machine": machine(), "threads": threads, "threads_note": thread_note,
              "load_average_1min": round(os.getloadavg()[0], 2),
              "config": {"batch": args.batch, "length": args.length, "d_model": args.d_model,
                         "d_ff": args.d_ff, "layers": args.layers, "experts": args.experts,
                         "vocab": args.vocab, "steps": args.steps},
              "switchzoo": ours, "transformers": theirs}
    result["table"] = table(result)
    emit(result, args.out)
    print(result["table"], file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
