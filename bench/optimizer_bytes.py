"""Optimizer traffic: the bytes one optimizer update reads and writes (XLA's cost analysis of
the update alone, compiled for this CPU from abstract state: the optimizer's arithmetic is
elementwise, so its bytes are the backend's too), and the optimizer state it keeps, for
Switch-Base-8 under AdamW with float32 moments, AdamW with bfloat16 moments
(--config.moments_dtype=bfloat16) and Adafactor (the paper's; configs/c4_gpu.py), each as
the run builds it (switchzoo.state.setup: per layer and per expert).

    python bench/optimizer_bytes.py [--model switch_base_8] [--out F]
"""
from __future__ import annotations

import math

from common import emit, machine, parser

OPTIMIZERS = {"adamw_f32": ("adamw", "float32"), "adamw_bf16": ("adamw", "bfloat16"),
              "adafactor": ("adafactor", "float32")}


def nbytes(tree) -> int:
    import jax
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def measure(cfg, name: str, dtype: str) -> dict:
    import jax
    import optax

    from switchzoo import state as state_lib
    tx = state_lib.make_optimizer(name, 1e-3, 100, moments_dtype=dtype)
    s = state_lib.setup(cfg, "data_parallel", "data:1", devices=jax.devices()[:1], optimizer=tx)
    abstract = jax.eval_shape(s.init)

    def update(params, opt_state, grads):
        updates, opt_state = s.tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state
    compiled = jax.jit(update, donate_argnums=(0, 1)).lower(
        abstract.params, abstract.opt_state, abstract.params).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return {"params_bytes": nbytes(abstract.params),
            "optimizer_state_bytes": nbytes(abstract.opt_state),
            "update_bytes_accessed": float(cost["bytes accessed"]),
            "update_flops": float(cost.get("flops", 0.0))}


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--model", default="switch_base_8", help="a catalogue model")
    args = p.parse_args(argv)
    import dataclasses

    from switchzoo import zoo
    cfg = dataclasses.replace(zoo.get(args.model), scan_layers=True)
    result = {"benchmark": "optimizer_bytes", "machine": machine(), "model": args.model,
              "optimizers": {k: measure(cfg, *v) for k, v in OPTIMIZERS.items()}}
    base = result["optimizers"]["adamw_f32"]["update_bytes_accessed"]
    for row in result["optimizers"].values():
        row["bytes_over_adamw_f32"] = row["update_bytes_accessed"] / base
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
