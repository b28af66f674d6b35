"""Pipeline parallelism on 8 simulated CPU devices: per-stage memory and the bubble, measured
from the compiled train steps of one decoder-only Switch LM.

For each schedule (stages S over a 'stage' axis, the rest of the 8 devices on 'data';
micro-batches M; rounds R) the step is compiled from abstract state (the dry run's way) and
read: parameter and optimizer bytes per device (from the shardings), XLA's temporaries per
device (activations and workspace), the all-reduces over the data shards (bytes a step, and
the most times one of them runs a step, all-reduces of one size and group counted together:
1 where the gradients are reduced once, after the loop), and the matmul FLOPs each device
executes inside the layer loops (switchzoo/planner/hlo.py, loop trip counts multiplied in). In switchzoo's pipeline a stage
with no micro-batch to run computes on a dummy one, so the bubble shows up as executed work:

    measured idle fraction = 1 - (useful layer FLOPs per device) / (executed layer FLOPs)

where the useful FLOPs are the unpipelined step's, on the same rows per data shard, divided
by S. The schedule's own figure is (S-1)/(RM+S-1). Everything outside the layer stacks (the
embedding, the output layer and loss, replicated over the stages) is left out of both. Every
schedule has the same rows per data shard (the global batch is rows x data shards), so memory
compares at equal work per device.

    python bench/pipeline_parallel.py [--layers 16] [--rows 32] [--length 64] [--out F]
        [--schedules 1x1x1,2x2x1,...] [--expert N]

--expert N splits each stage's devices as data x expert (N on 'expert') under dp_pp_ep's rules,
batch over data+expert and the experts over expert (and the unpipelined reference likewise): the
all-reduces counted are then those over either batch axis.
"""
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dataclasses  # noqa: E402
import time  # noqa: E402

from common import emit, machine, parser  # noqa: E402

SCHEDULES = [(1, 1, 1), (2, 2, 1), (2, 8, 1), (4, 4, 1), (4, 16, 1), (8, 8, 1), (8, 32, 1),
             (2, 8, 2), (4, 16, 2)]                      # (stages, micro-batches, rounds)


def compile_step(cfg, mesh: str, layout: str, batch: int, length: int, devices):
    import jax
    import numpy as np

    from switchzoo import inspector, state as state_lib, steps
    from switchzoo.planner import hlo
    setup = state_lib.setup(cfg, layout, mesh, devices=devices, optimizer="adafactor")
    fake = {k: jax.ShapeDtypeStruct((batch, length), dt) for k, dt in
            (("inputs", np.int32), ("targets", np.int32), ("weights", np.float32))}
    start = time.perf_counter()
    compiled = steps.make_train_step(setup).lower(setup.abstract, fake).compile()
    seconds = time.perf_counter() - start
    per_device = lambda tree, sh: inspector._bytes_per_device(tree, sh)   # noqa: E731
    program = hlo.read(compiled.as_text(), dict(setup.mesh.shape))
    over_data = [c for c in program.collectives     # over the batch's axes (data, expert)
                 if c.kind == "all-reduce" and {"data", "expert"} & set(c.axes)]
    return {"params_bytes_per_device": per_device(setup.abstract.params, setup.shardings.params),
            "opt_bytes_per_device": per_device(setup.abstract.opt_state,
                                               setup.shardings.opt_state),
            "temp_bytes_per_device": inspector.memory_stats(compiled)["temp_bytes"],
            "layer_flops_per_device": hlo.loop_flops(compiled.as_text()),
            # the gradients' reduction over the data shards (a pipeline's per-shard stages:
            # once a step; an unpipelined scan: once per layer group)
            "data_all_reduce_bytes_per_step": sum(c.bytes * c.count for c in over_data),
            "data_all_reduce_most_per_step": max((c.count for c in over_data), default=0),
            "compile_seconds": round(seconds, 2)}


def main():
    p = parser(__doc__)
    p.add_argument("--model", default="switch_tiny")
    p.add_argument("--layers", type=int, default=16, help="decoder layers (scanned in pairs)")
    p.add_argument("--rows", type=int, default=32, help="sequences per data shard")
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--expert", type=int, default=1, help="devices of each stage on 'expert'")
    p.add_argument("--schedules", default=",".join("x".join(map(str, s)) for s in SCHEDULES),
                   help="stages x micro-batches x rounds, comma-separated")
    args = p.parse_args()
    schedules = [tuple(map(int, s.split("x"))) for s in args.schedules.split(",")]
    bad = [s for s in schedules if args.expert < 1 or (8 // s[0]) % args.expert]
    if bad:
        p.error(f"--expert {args.expert} does not divide the {8 // bad[0][0]} devices of a "
                f"stage at {bad[0][0]} stages; give a divisor of 8 / the largest stage count")
    import jax

    from switchzoo import zoo
    base = zoo.get(args.model)
    base = base.replace(num_layers=args.layers, scan_layers=True, remat="full",
                        moe=dataclasses.replace(base.moe, jitter=0.0))
    rows = []
    reference = {}
    for stages, micro, rounds in schedules:
        data = 8 // stages
        E = args.expert
        flat, rules = ((f"data:{data}", "batch:data") if E == 1 else
                       (f"data:{data // E},expert:{E}", "batch:data+expert,experts:expert"))
        if stages not in reference:      # unpipelined, the same rows per data shard
            reference[stages] = compile_step(base, flat, rules, args.rows * data, args.length,
                                             jax.devices()[:data])
        cfg = base.replace(pipeline_microbatches=micro, pipeline_repeats=rounds)
        got = (reference[1] if stages == 1 else
               compile_step(cfg, f"stage:{stages},{flat}", f"{rules},layers:stage",
                            args.rows * data, args.length, jax.devices()))
        useful = reference[stages]["layer_flops_per_device"] / stages
        rows.append({"stages": stages, "microbatches": micro, "rounds": rounds, **got,
                     "measured_idle_fraction": round(1 - useful / got["layer_flops_per_device"],
                                                     4),
                     "schedule_bubble": round((stages - 1) / (rounds * micro + stages - 1), 4)})
        print(rows[-1], flush=True)
    emit({"machine": machine(), "model": args.model, "layers": args.layers, "expert": args.expert,
          "rows_per_data_shard": args.rows, "length": args.length, "optimizer": "adafactor",
          "remat": "full", "rows": rows}, args.out)


if __name__ == "__main__":
    main()
