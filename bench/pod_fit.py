"""Fitting the paper's hardware: the smallest slice on which each Switch model's train step fits
a TPUv3 core's 16 GiB, and compile time against depth with scanned and unrolled layers.

    python bench/pod_fit.py --out docs/bench/pod_fit.json          # both parts (~15 min here)
    python bench/pod_fit.py --models switch_base_128 --no-depth    # one model's search

Fit: each model's train step is compiled (bench/pod.py's case runner: the layout inspector in a
fresh process on N simulated CPU devices) at power-of-two device counts, halving while it fits
and doubling while it does not, until the boundary is found; every case tried is reported. A
case fits when XLA's memory analysis per device (peak estimate: arguments + outputs - aliased +
temporaries, switchzoo/inspector.py) is at most --budget-gib. One sequence of 512 tokens per
device (inputs and targets), so the global batch grows with the slice; bfloat16 activations,
every block rematerialised, layers scanned (bench/pod.py's defaults). Parallelism per model:
  * switch_base_128, switch_large_128: data + expert (as bench/pod.py: expert axis
    gcd(devices, experts), the batch over every device, dense weights replicated).
  * switch_xxl_128: model:8 (heads, d_ff and vocab split 8 ways), expert axis up to the 128
    experts, data the rest (dp_mp_ep): replicated, its ~8B dense parameters alone are 31 GiB.
  * switch_c_2048: expert parallelism only, as the paper ran Switch-C (expert:N up to 2,048;
    beyond, data:N/2048).
Depth: a small model (switch_tiny, 8 x 128 tokens, one device, the same settings) compiled
with 6, 12 and 24 layers, scanned and unrolled: compile seconds and the compiled program's
size in HLO instructions.
"""
from __future__ import annotations

import sys
import time

import pod
from common import emit, machine, parser

GIB = 2 ** 30
# model: (first device count tried, fewest, most)
SEARCH = {"switch_base_128": (16, 1, 512), "switch_large_128": (64, 1, 1024),
          "switch_xxl_128": (256, 8, 2048), "switch_c_2048": (2048, 1, 4096)}


def case_for(model: str, devices: int) -> dict:
    """bench/pod.py's case of ``model`` on ``devices`` with the parallelism above."""
    if model.startswith("switch_c"):
        expert = min(devices, 2048)
        return pod.resolve(f"{model}:{devices}/data:{devices // expert},model:1,"
                           f"expert:{expert}/batch:data+expert,experts:expert")
    if model.startswith("switch_xxl"):
        model_axis = min(8, devices)
        expert = min(128, devices // model_axis)
        data = devices // (model_axis * expert)
        return pod.resolve(f"{model}:{devices}/data:{data},model:{model_axis},"
                           f"expert:{expert}/dp_mp_ep")
    return pod.resolve(f"{model}:{devices}")


def peak(result: dict) -> int | None:
    return result.get("memory", {}).get("peak_estimate_bytes")


def search(model: str, args) -> dict:
    """Every case tried and the smallest power-of-two slice that fits (None if none did)."""
    first, low, high = SEARCH[model]
    tried: dict[int, dict] = {}

    def fits(n: int) -> bool | None:
        if n not in tried:
            tried[n] = pod.run_case(case_for(model, n), args)
        p = peak(tried[n])
        return None if p is None else p <= args.budget_gib * GIB
    n = first
    if fits(n):
        while n // 2 >= low and fits(n // 2):
            n //= 2
        smallest = n
    else:
        smallest = None
        while n * 2 <= high:
            n *= 2
            before = peak(tried[n // 2])
            if fits(n):
                smallest = n
                break
            if peak(tried[n]) is None or (before is not None and peak(tried[n]) >= before):
                break       # more devices no longer lower the peak: no slice of this layout fits
    return {"model": model, "smallest_fitting_devices": smallest, "budget_gib": args.budget_gib,
            "cases": [tried[k] for k in sorted(tried)]}


def depth_sweep(args) -> list[dict]:
    """Compile seconds and HLO instructions of switch_tiny's train step at 6, 12, 24 layers."""
    import jax
    import numpy as np

    from switchzoo import state as state_lib
    from switchzoo import steps, zoo
    rows = []
    for layers in (6, 12, 24):
        for scan in (True, False):
            cfg = zoo.get("switch_tiny").replace(num_layers=layers, dtype=args.dtype,
                                                  remat=args.remat, scan_layers=scan)
            setup = state_lib.setup(cfg, "data_parallel", "data:1", devices=jax.devices()[:1],
                                    optimizer=args.optimizer)
            step = steps.make_train_step(setup)
            batch = {k: jax.ShapeDtypeStruct((8, 128), dt) for k, dt in
                     (("inputs", np.int32), ("targets", np.int32), ("weights", np.float32))}
            start = time.perf_counter()
            compiled = step.lower(setup.abstract, batch).compile()
            seconds = time.perf_counter() - start
            instructions = sum(1 for line in compiled.as_text().splitlines() if " = " in line)
            rows.append({"layers": layers, "scan_layers": scan,
                         "compile_seconds": round(seconds, 2), "hlo_instructions": instructions})
            print(f"[depth] {layers} layers, {'scanned' if scan else 'unrolled'}: "
                  f"{seconds:.1f} s, {instructions} instructions", file=sys.stderr, flush=True)
    return rows


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--models", nargs="*", default=list(SEARCH), choices=list(SEARCH))
    p.add_argument("--budget-gib", type=float, default=16.0, help="memory per device")
    p.add_argument("--timeout", type=float, default=900, help="seconds per case")
    p.add_argument("--no-depth", action="store_true", help="skip the compile-time sweep")
    pod.add_step_arguments(p)
    args = p.parse_args(argv)
    fit = [search(m, args) for m in args.models]
    depth = [] if args.no_depth else depth_sweep(args)
    emit({"machine": machine(), "config": {**pod.step_config(args),
                                           "budget_gib": args.budget_gib},
          "fit": fit, "depth": depth}, args.out)
    return 1 if any(c["status"] == "error" for f in fit for c in f["cases"]) else 0


if __name__ == "__main__":
    sys.exit(main())
