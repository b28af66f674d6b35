"""XLA's FLOPs of a train step against the hand count, per dispatch: what a step executes beyond
the model's arithmetic (one-hot dispatch and combine, capacity padding). Measurable on a CPU:
the step is lowered from abstract state (nothing allocated, nothing compiled) and XLA's cost
analysis of the lowered program is read; unrolled layers, so every layer is counted (XLA counts
a loop's body once), and the full-logits loss (loss_chunk=0) for the same reason: the chunked
loss runs the same three vocabulary matmuls per token in a loop (tests/test_loss.py).

    python bench/flops.py [--model switch_base_8 --batch 32 --length 512] [--out F]

Goal (issue 32): XLA ÷ hand <= 1.10 for Switch-Base-8 at 32 x 512 (the one-hot einsum: 1.70).
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dataclasses  # noqa: E402
import time  # noqa: E402

from common import emit, machine, parser  # noqa: E402

DISPATCHES = ("einsum", "index")


def lowered_flops(cfg, batch: int, length: int) -> tuple[float, float]:
    """(XLA FLOPs of the lowered train step, seconds to lower it) on one device."""
    import jax
    import jax.numpy as jnp

    from switchzoo import state as state_lib
    from switchzoo import steps
    setup = state_lib.setup(cfg, "data_parallel", "data:1", devices=jax.devices()[:1],
                            optimizer="adamw")
    step = steps.make_train_step(setup, loss_chunk=0)
    ids = jax.ShapeDtypeStruct((batch, length), jnp.int32)
    shapes = {"inputs": ids, "targets": ids,
              "weights": jax.ShapeDtypeStruct((batch, length), jnp.float32)}
    start = time.perf_counter()
    analysis = step.lower(setup.abstract, shapes).cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    return float(analysis["flops"]), time.perf_counter() - start


def main():
    p = parser(__doc__)
    p.add_argument("--model", default="switch_base_8")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args()

    from switchzoo import zoo
    base = zoo.get(args.model).replace(dtype=args.dtype, scan_layers=False)
    if base.moe is None:
        p.error(f"--model {args.model} has no Switch layers: name a Switch model "
                "(python -m switchzoo.zoo lists them)")
    # An encoder-decoder reads one source and one target token per position (flops_per_token).
    hand = 3 * zoo.flops_per_token(base, seq_len=args.length) * args.batch * args.length
    cases = {}
    for dispatch in DISPATCHES:
        cfg = base.replace(moe=dataclasses.replace(base.moe, dispatch=dispatch))
        flops, seconds = lowered_flops(cfg, args.batch, args.length)
        cases[dispatch] = {"flops_xla": flops, "xla_over_hand": round(flops / hand, 4),
                           "lower_s": round(seconds, 1)}
        print(f"{dispatch}: {flops / 1e12:.2f} TFLOP, {flops / hand:.3f} x hand", flush=True)
    ratio = cases["index"]["xla_over_hand"]
    emit({"bench": "flops", "machine": machine(),
          "config": {"model": args.model, "batch": args.batch, "length": args.length,
                     "dtype": args.dtype, "optimizer": "adamw", "group_size":
                     base.moe.group_size, "train_capacity_factor":
                     base.moe.train_capacity_factor, "scan_layers": False, "loss_chunk": 0},
          "flops_hand": hand, "cases": cases,
          "dispatch_and_padding_share_einsum": round(
              1 - hand / cases["einsum"]["flops_xla"], 3),
          "goals": {"xla_over_hand_index": {"value": ratio, "goal": "<= 1.10",
                                            "met": ratio <= 1.10}}}, args.out)


if __name__ == "__main__":
    main()
