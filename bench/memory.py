"""Memory benchmarks (8 simulated devices, set here before JAX loads):

  * Per-device bytes of parameters + AdamW state of the Switch bench model under dp_mp_ep on
    (data 2, model 2, expert 2), measured on the allocated arrays (the device holding most) and
    in XLA's memory analysis of the train step, / the ideal: every tensor split over exactly
    the devices its layout names (bytes / shards), replicated ones whole. Goal <= 1.05.
  * Temporary bytes (XLA memory analysis) of one Switch layer's forward + backward as the
    routing group grows, einsum (capacity slots) vs dropless dispatch, same tokens.

    python bench/memory.py [--out F]
"""
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import math  # noqa: E402

from common import Step, emit, machine, parser  # noqa: E402


def state_bytes(step) -> dict:
    """Measured bytes per device (max over devices) and the ideal, over params + opt state."""
    import collections

    import jax

    from switchzoo.layout import spec_axes
    per_device = collections.Counter()
    ideal = 0
    for leaf in jax.tree.leaves((step.state.params, step.state.opt_state)):
        for shard in leaf.addressable_shards:
            per_device[shard.device.id] += shard.data.nbytes
        spec = leaf.sharding.spec
        shards = math.prod(leaf.sharding.mesh.shape[a] for e in spec for a in spec_axes(e))
        ideal += leaf.nbytes / shards
    return {"measured_max": max(per_device.values()), "measured_min": min(per_device.values()),
            "ideal": ideal, "total": sum(leaf.nbytes for leaf in jax.tree.leaves(
                (step.state.params, step.state.opt_state)))}


def dispatch_temp_bytes(dispatch: str, group_size: int, tokens: int, d_model: int,
                        d_ff: int) -> int:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from switchzoo.config import MoeConfig
    from switchzoo.moe import SwitchFFN
    cfg = MoeConfig(num_experts=8, group_size=group_size, train_capacity_factor=1.25,
                    dispatch=dispatch)
    graphdef, state = nnx.split(SwitchFFN(d_model, d_ff, cfg, nnx.Rngs(0)))

    def loss(state, x):
        y, stats = nnx.merge(graphdef, state)(x, rng=jax.random.key(0))
        return jnp.sum(y * y) + stats["aux_loss"]
    x = jax.ShapeDtypeStruct((tokens // 512, 512, d_model), jnp.float32)
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(state, x).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)


def main():
    p = parser(__doc__)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--groups", default="64,128,256,512,1024,2048,4096",
                   help="comma-separated routing group sizes of the dispatch layer")
    args = p.parse_args()
    from train_step import configs
    args.layers, args.vocab, args.group_size = 4, 8192, 256
    _, switch = configs(args)
    step = Step(switch, "data:2,model:2,expert:2", "dp_mp_ep", batch=8, length=256)
    measured = state_bytes(step)
    mem = step.memory()
    batch_bytes = sum(x.nbytes for x in step.data.values()) // 4      # split over data+expert
    xla_state = mem["argument_bytes"] - batch_bytes
    try:
        groups = [int(g) for g in args.groups.split(",")]
    except ValueError:
        p.error(f"--groups {args.groups!r}: give comma-separated integers, e.g. 64,4096")
    temp = {d: {g: dispatch_temp_bytes(d, g, args.tokens, args.d_model, 4 * args.d_model)
                for g in groups} for d in ("einsum", "dropless")}
    ratio = round(measured["measured_max"] / measured["ideal"], 4)
    emit({
        "bench": "memory", "machine": machine(),
        "config": {"model": "train_step.py's Switch (d_model 512, 4 layers, 8 experts)",
                   "mesh": "data:2,model:2,expert:2", "layout": "dp_mp_ep", "optimizer": "adamw",
                   "dispatch_layer": {"tokens": args.tokens, "d_model": args.d_model,
                                      "d_ff": 4 * args.d_model, "experts": 8,
                                      "capacity_factor": 1.25}},
        "state_bytes": {**measured, "xla_argument_minus_batch": xla_state,
                        "fraction_of_total": round(measured["measured_max"] / measured["total"],
                                                   4)},
        "dispatch_temp_bytes": {d: {str(g): v for g, v in t.items()} for d, t in temp.items()},
        "goals": {
            "state_bytes_per_device_over_ideal": {"value": ratio, "goal": "<= 1.05",
                                                  "met": ratio <= 1.05},
            "xla_argument_bytes_over_ideal": {
                "value": round(xla_state / measured["ideal"], 4), "goal": "<= 1.05",
                "met": xla_state / measured["ideal"] <= 1.05}},
    }, args.out)


if __name__ == "__main__":
    main()
