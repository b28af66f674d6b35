"""Where switchzoo's greedy decoding time goes at the peer config (bench/peer.py's model, batch
and prompt): one jax.profiler trace of a few ``generate`` calls, every executed XLA op
attributed to its model part (bench/op_kinds) and the 30 slowest ops listed.

    python bench/decode_profile.py [--threads 1] [--steps 3] [--out f.json]

The encoder pass and the scanned decoder steps are one program (switchzoo.decoding.sample), so
the rows add both; ``per_generate_ms`` is the wall time of one call.
"""
from __future__ import annotations

import glob
import os
import sys
import tempfile
import time

from common import emit, machine

import gpu_profile
import peer
from op_kinds import hlo_ops


def build_parser():
    p = peer.build_parser()
    p.description = __doc__.strip().splitlines()[0]
    p.add_argument("--steps", type=int, default=3, help="profiled generate calls")
    p.set_defaults(threads=1)
    return p


def profile(pair, args, trace_dir: str) -> dict:
    import jax
    import jax.numpy as jnp

    from switchzoo import decoding
    from switchzoo import layout as layout_lib
    ours = pair.ours
    src = jnp.asarray(pair.src, jnp.int32)
    seg = jnp.asarray(pair.mask, jnp.int32)
    kw = dict(max_new=args.new_tokens, greedy=True, temperature=1.0, top_k=0, eos_id=1)
    with layout_lib.use(ours.layout):
        text = decoding.sample.lower(ours.graphdef, ours.params, src, seg, jax.random.key(0),
                                     **kw).compile().as_text()
    ops = hlo_ops(text)

    def call():
        return ours.generate(pair.src, attention_mask=pair.mask,
                             max_new_tokens=args.new_tokens)
    for _ in range(3):
        call()
    jax.profiler.start_trace(trace_dir)
    start = time.perf_counter()
    for _ in range(args.steps):
        call()
    wall = (time.perf_counter() - start) / args.steps
    jax.profiler.stop_trace()
    path = sorted(glob.glob(os.path.join(trace_dir, "plugins/profile/*/*.xplane.pb")))[-1]
    out = gpu_profile.attribute(path, ops, args.steps, wall * 1e3)
    out["per_generate_ms"] = round(wall * 1e3, 2)
    return out


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    allowed = os.sched_getaffinity(0)
    threads = args.threads or len(allowed)
    note = peer.limit_threads(threads)
    try:
        pair = peer.Pair(args)
        with tempfile.TemporaryDirectory() as tmp:
            ours = profile(pair, args, tmp)
    finally:
        os.sched_setaffinity(0, allowed)
    result = {"benchmark": "profile: switchzoo greedy decoding at the peer config",
              "machine": machine(), "threads": threads, "threads_note": note,
              "load_average_1min": round(os.getloadavg()[0], 2), "switchzoo": ours}
    emit(result, args.out)
    for k in ours["top_kernels"]:
        print(f"{k['ms']:8.3f}  {k['kernel']:28s} {k['op_name'][:110]}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
