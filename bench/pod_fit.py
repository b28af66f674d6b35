"""Fitting the paper's hardware: the smallest slice on which each Switch model's train step fits
a TPUv3 core's 16 GiB, and compile time against depth with scanned and unrolled layers.

    python bench/pod_fit.py --out docs/bench/pod_fit.json         # every part (~15 min here)
    python bench/pod_fit.py --parts fit --models switch_base_128  # one model's search

Fit: each model's train step is compiled (bench/pod.py's case runner: the layout inspector in a
fresh process on N simulated CPU devices) at power-of-two device counts, halving while it fits
and doubling while it does not, until the boundary is found; at each count every mesh below is
tried and the lowest peak counts; every case tried is reported. A case fits when XLA's memory
analysis per device (peak estimate: arguments + outputs - aliased + temporaries,
switchzoo/inspector.py) is at most --budget-gib. One sequence of 512 tokens per device, or
per model replica with a model axis (inputs and targets), so the global batch grows with the
slice; bfloat16 activations, every block rematerialised, layers scanned (bench/pod.py's
defaults). Parallelism per model:
  * switch_base_128, switch_large_128: data + expert (as bench/pod.py: expert axis
    gcd(devices, experts), the batch over every device, dense weights replicated).
  * switch_xxl_128: model axis 8, 16, 32 or 64 (heads, d_ff and vocab split; dp_mp_ep), expert
    axis up to the 128 experts, data the rest: replicated, its ~8B dense parameters alone are
    31 GiB.
  * switch_c_2048: expert parallelism only, as the paper ran Switch-C (expert:N), and with
    model:2 (30 heads split in two; dp_mp_ep). At most 2,048 devices: XLA:CPU refuses to
    compile for 4,096 simulated devices ("Multiprocess computations aren't implemented").
Depth: a small model (switch_tiny, 8 x 128 tokens, one device, the same settings) compiled
with 6, 12 and 24 layers, scanned and unrolled: compile seconds (best of --repeats) and the
compiled program's size in HLO instructions.
Remat: the same small model's train step (8 x 128 tokens, one device), scanned and unrolled,
under each remat policy: XLA's temporary bytes.
"""
from __future__ import annotations

import sys
import time

import pod
from common import emit, machine, parser

GIB = 2 ** 30
# model: (first device count tried, fewest, most, model-axis sizes tried; 0: data + expert)
SEARCH = {"switch_base_128": (16, 1, 512, (0,)), "switch_large_128": (64, 1, 1024, (0,)),
          "switch_xxl_128": (256, 8, 2048, (8, 16, 32, 64)),
          "switch_c_2048": (2048, 1, 2048, (1, 2))}


def cases_for(model: str, devices: int) -> list[dict]:
    """bench/pod.py's cases of ``model`` on ``devices``, one per mesh above."""
    from switchzoo import zoo
    *_, model_axes = SEARCH[model]
    out = []
    for m in model_axes:
        if m == 0:
            out.append(pod.resolve(f"{model}:{devices}"))
            continue
        if m > devices:
            continue
        expert = min(zoo.get(model).moe.num_experts, devices // m)
        layout = "batch:data+expert,experts:expert" if m == 1 else "dp_mp_ep"
        out.append(pod.resolve(f"{model}:{devices}/data:{devices // (m * expert)},model:{m},"
                               f"expert:{expert}/{layout}"))
    return out


def peak(result: dict) -> int | None:
    return result.get("memory", {}).get("peak_estimate_bytes")


def search(model: str, args) -> dict:
    """Every case tried and the smallest power-of-two slice that fits (None if none did)."""
    first, low, high, _ = SEARCH[model]
    tried: dict[int, list[dict]] = {}
    best: dict[int, int | None] = {}      # the lowest peak of a device count's meshes

    def fits(n: int) -> bool:
        if n not in tried:
            tried[n] = [pod.run_case(c, args) for c in cases_for(model, n)]
            peaks = [p for p in map(peak, tried[n]) if p is not None]
            best[n] = min(peaks) if peaks else None
        return best[n] is not None and best[n] <= args.budget_gib * GIB
    n = first
    if fits(n):
        while n // 2 >= low and fits(n // 2):
            n //= 2
        smallest = n
    else:
        smallest = None
        while n * 2 <= high:
            n *= 2
            if fits(n):
                smallest = n
                break
            if best[n] is None or (best[n // 2] is not None and best[n] >= best[n // 2]):
                break       # more devices no longer lower the peak: no slice of these fits
    fitting = [c for c in tried.get(smallest, []) if peak(c) == best.get(smallest)]
    return {"model": model, "smallest_fitting_devices": smallest,
            "mesh": fitting[0]["mesh"] if fitting else None, "budget_gib": args.budget_gib,
            "cases": [c for k in sorted(tried) for c in tried[k]]}


def small_step(args, **fields) -> dict:
    """switch_tiny's train step (8 x 128 tokens, one device) with ModelConfig ``fields``:
    compile seconds (the best of --repeats compiles, each from scratch: the machine is
    shared), HLO instructions and temporary bytes."""
    import jax
    import numpy as np

    from switchzoo import state as state_lib
    from switchzoo import steps, zoo
    cfg = zoo.get("switch_tiny").replace(**{"dtype": args.dtype, "remat": args.remat,
                                            **fields})
    setup = state_lib.setup(cfg, "data_parallel", "data:1", devices=jax.devices()[:1],
                            optimizer=args.optimizer)
    batch = {k: jax.ShapeDtypeStruct((8, 128), dt) for k, dt in
             (("inputs", np.int32), ("targets", np.int32), ("weights", np.float32))}
    seconds = float("inf")
    for _ in range(args.repeats):
        jax.clear_caches()                  # else the second compile is a cache hit
        start = time.perf_counter()
        compiled = steps.make_train_step(setup).lower(setup.abstract, batch).compile()
        seconds = min(seconds, time.perf_counter() - start)
    row = {**fields, "compile_seconds": round(seconds, 2),
           "hlo_instructions": sum(" = " in line for line in compiled.as_text().splitlines()),
           "temp_bytes": int(compiled.memory_analysis().temp_size_in_bytes)}
    print(f"[small] {row}", file=sys.stderr, flush=True)
    return row


def depth_sweep(args) -> list[dict]:
    """Compile seconds and program size at 6, 12, 24 layers, scanned and unrolled."""
    return [small_step(args, num_layers=n, scan_layers=scan)
            for n in (6, 12, 24) for scan in (True, False)]


def remat_sweep(args) -> list[dict]:
    """Temporaries of each remat policy, scanned and unrolled (4 layers)."""
    return [small_step(args, scan_layers=scan, remat=remat)
            for scan in (True, False) for remat in ("none", "full", "dots")]


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--models", nargs="*", default=list(SEARCH), choices=list(SEARCH))
    p.add_argument("--budget-gib", type=float, default=16.0, help="memory per device")
    p.add_argument("--timeout", type=float, default=900, help="seconds per case")
    p.add_argument("--parts", nargs="+", default=["fit", "depth", "remat"],
                   choices=("fit", "depth", "remat"))
    p.add_argument("--repeats", type=int, default=3, help="compiles per small step (best)")
    pod.add_step_arguments(p)
    args = p.parse_args(argv)
    fit = [search(m, args) for m in args.models] if "fit" in args.parts else []
    emit({"machine": machine(), "config": {**pod.step_config(args),
                                           "budget_gib": args.budget_gib},
          "fit": fit, "depth": depth_sweep(args) if "depth" in args.parts else [],
          "remat": remat_sweep(args) if "remat" in args.parts else []}, args.out)
    return 1 if any(c["status"] == "error" for f in fit for c in f["cases"]) else 0


if __name__ == "__main__":
    sys.exit(main())
