"""The layout search's compute term checked on this CPU: HLO matmul FLOPs against measured time.

    python bench/layout_cost.py [--out docs/bench/layout_cost.json] [--repeats 5]

The search (switchzoo/planner/search.py) prices compute as the per-device matmul FLOPs read from
the compiled program (switchzoo/planner/hlo.py, loop bodies times their trip counts) over the
device's peak. Here one model's train step runs for real under several layouts on 8 simulated
CPU devices. The 8 devices share this machine's cores, so a step's wall time is the work of all
8 together: if the FLOP count is a fair measure of the work, the achieved FLOP/s (8 x per-device
FLOPs / step seconds) is about the same under every layout, including layouts that repeat work
on several devices (their per-device FLOPs grow, and so does the time). A sanity check only:
communication cannot be timed on simulated devices, and XLA:CPU's elementwise work, which the
count leaves out, weighs more here than on an accelerator.
"""
from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()

from common import best_of, emit, machine, parser  # noqa: E402

LAYOUTS = [   # (mesh, layout): every device busy, or work repeated on some
    ("data:8,model:1,expert:1", "batch:data"),
    ("data:2,model:1,expert:4", "batch:data+expert,experts:expert"),
    ("data:2,model:4,expert:1", "batch:data,heads:model,d_ff:model,vocab:model"),
    ("data:1,model:1,expert:8", "batch:expert,experts:expert"),
    ("data:2,model:1,expert:4", "batch:data,experts:expert"),        # tokens repeated 4x
    ("data:2,model:4,expert:1", "batch:data"),                       # everything repeated 4x
]


def measure(model: str, mesh: str, layout: str, batch: int, length: int, repeats: int,
            width: dict) -> dict:
    import jax
    import numpy as np

    from switchzoo import state as state_lib, steps, zoo
    from switchzoo.planner import hlo
    cfg = zoo.get(model).replace(**width)
    setup = state_lib.setup(cfg, layout, mesh, optimizer="adafactor")
    step = steps.make_train_step(setup)
    rng = np.random.default_rng(0)
    data = {"inputs": rng.integers(2, cfg.vocab_size, (batch, length), dtype=np.int32),
            "targets": rng.integers(2, cfg.vocab_size, (batch, length), dtype=np.int32),
            "weights": np.ones((batch, length), np.float32)}
    compiled = step.lower(setup.abstract, data).compile()
    program = hlo.read(compiled.as_text(), dict(setup.layout.mesh.shape))
    state = setup.init()

    def run():
        nonlocal state
        state, metrics = step(state, data)
        jax.block_until_ready(metrics)
    seconds = best_of(run, repeats=repeats, warmup=2)
    total = program.flops * setup.layout.mesh.size
    return {"mesh": mesh, "layout": layout, "flops_per_device": program.flops,
            "flops_all_devices": total, "step_seconds": round(seconds, 4),
            "achieved_gflops": round(total / seconds / 1e9, 2)}


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--model", default="switch_tiny")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--d-model", type=int, default=256, help="wide enough for matmuls to "
                                                            "dominate the step")
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--heads", type=int, default=8)
    args = p.parse_args(argv)
    width = {"d_model": args.d_model, "d_ff": args.d_ff, "num_heads": args.heads,
             "d_kv": args.d_model // args.heads}
    rows = []
    for mesh, layout in LAYOUTS:
        rows.append(measure(args.model, mesh, layout, args.batch, args.length, args.repeats,
                            width))
        print(rows[-1], file=sys.stderr, flush=True)
    rates = [r["achieved_gflops"] for r in rows]
    emit({"machine": machine(), "config": {"model": args.model, **width, "batch": args.batch,
                                           "length": args.length, "optimizer": "adafactor",
                                           "dtype": "float32", "devices": 8},
          "rows": rows, "achieved_gflops_max_over_min": round(max(rates) / min(rates), 2)},
         args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
