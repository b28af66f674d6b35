"""Copies and dynamic-update-slices of a scanned train step: Switch-Base-8 (bf16, AdamW, no
dropout) compiled for this CPU from abstract state at --batch x --length, scanned layers, under
each remat policy; XLA's memory analysis (temporaries) and, read from the optimized HLO
(switchzoo.planner.hlo.data_movement), how many copies and dynamic-update-slices run per step
and the bytes they write, loop trip counts multiplied in, with the largest.

    python bench/scan_copies.py [--batch 32] [--length 512] [--remats none,minimal] [--out F]

XLA:CPU is not XLA:GPU: its copy insertion and fusion differ, so these are the program's
structure (what the scan stacks, what it copies), not a GPU's bytes.
"""
from __future__ import annotations

import dataclasses
import time

from common import emit, machine, parser


def measure(cfg, batch: int, length: int) -> dict:
    import jax
    import jax.numpy as jnp

    from switchzoo import state as state_lib
    from switchzoo import steps
    from switchzoo.planner import hlo
    setup = state_lib.setup(cfg, "data_parallel", "data:1", devices=jax.devices()[:1],
                            optimizer="adamw")
    ids = jax.ShapeDtypeStruct((batch, length), jnp.int32)
    data = {"inputs": ids, "targets": ids,
            "weights": jax.ShapeDtypeStruct((batch, length), jnp.float32)}
    start = time.perf_counter()
    compiled = steps.make_train_step(setup).lower(jax.eval_shape(setup.init), data).compile()
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    moved = hlo.data_movement(compiled.as_text())
    return {"compile_s": round(seconds, 1),
            "temp_bytes": int(memory.temp_size_in_bytes),
            "argument_bytes": int(memory.argument_size_in_bytes),
            **{f"{op.replace('-', '_')}_{k}": v for op, row in moved.items()
               for k, v in row.items()}}


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--remats", default="none,minimal")
    p.add_argument("--shrink", action="store_true", help="a 2+2-layer Switch-Base-8 (tests)")
    args = p.parse_args(argv)
    from switchzoo import zoo
    cfg = dataclasses.replace(zoo.get("switch_base_8"), dtype="bfloat16", dropout=0.0,
                              scan_layers=True)
    if args.shrink:
        cfg = dataclasses.replace(cfg, num_layers=4, num_encoder_layers=4, d_model=64,
                                  d_ff=128, num_heads=2, d_kv=32, vocab_size=256)
    result = {"benchmark": "scan_copies", "machine": machine(), "model": "switch_base_8",
              "batch": args.batch, "length": args.length, "shrunk": args.shrink,
              "remats": {r: measure(dataclasses.replace(cfg, remat=r), args.batch, args.length)
                         for r in args.remats.split(",")}}
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
