"""CPU time of one train.py-like process under sets of XLA flags, the sets alternated: the
tests' compile flags (tests/conftest.py) are chosen with it. Each run is a fresh process that
trains --steps steps of --model (switchzoo.loop.train: input, init, the train step's compile,
a checkpoint) on 8 simulated CPU devices under --layout / --mesh, and reports its own CPU
seconds (every thread's) and its XLA compile seconds. On a shared machine run it as loaded as
the suite is (the suite runs three workers on two cores), and compare the means of one run.

    python bench/compile_cpu.py --set default= split1=--xla_cpu_parallel_codegen_split_count=1 \
        [--reps 6] [--base="--xla_backend_optimization_level=0 ..."] [--out F]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import emit, machine, parser

# The tests' flags (tests/conftest.py FAST_COMPILE, without the flags under test)
BASE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def child(model: str, steps: int, layout: str, mesh: str) -> dict:
    """One process's run: its CPU seconds and XLA's compile seconds."""
    from jax._src import monitoring

    from switchzoo import loop
    from switchzoo.configs import mini
    compiled = [0.0]

    def listen(event, seconds, **_):
        if event.endswith("backend_compile_duration"):
            compiled[0] += seconds
    monitoring.register_event_duration_secs_listener(listen)
    c = mini.get_config(f"model={model},task=translation,steps={steps}")
    c.per_device_batch_size, c.max_length, c.eval_every_steps = 1, 32, 0
    c.checkpoint_every_steps, c.layout, c.mesh = steps, layout, mesh
    c.data.vocab_size, c.data.embedded_max_pairs = 300, 500
    c.data.locale_dir = "/nonexistent-catalogues"        # the shipped pairs alone
    start = time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        loop.train(c, os.path.join(tmp, "run"), print_fn=lambda *_: None)
    return {"cpu_s": round(time.process_time() - start, 3),
            "compile_s": round(compiled[0], 3)}


def flag_sets(items) -> dict[str, str]:
    """LABEL=FLAGS items -> {label: flags}; a one-line error for an item without a label."""
    sets = {}
    for item in items:
        label, eq, flags = item.partition("=")
        if not eq or not label or label.startswith("-"):
            sys.exit(f"error: --set {item!r}: give LABEL=FLAGS (e.g. default= for the base "
                     "alone)")
        sets[label] = flags
    return sets


def summary(runs: dict[str, list[dict]]) -> dict:
    """Per flag set: the mean and range of its runs' CPU and compile seconds, and its mean CPU
    over the first set's."""
    out, first = {}, None
    for flags, rs in runs.items():
        cpu = [r["cpu_s"] for r in rs]
        out[flags] = {"cpu_s_mean": round(statistics.fmean(cpu), 3),
                      "cpu_s_range": [min(cpu), max(cpu)],
                      "compile_s_mean": round(statistics.fmean(r["compile_s"] for r in rs), 3),
                      "runs": len(rs)}
        first = first or out[flags]["cpu_s_mean"]
        out[flags]["cpu_over_first"] = round(out[flags]["cpu_s_mean"] / first, 3)
    return out


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--set", nargs="+", required=True, metavar="LABEL=FLAGS",
                   help="the flag sets to compare (LABEL= for the base alone)")
    p.add_argument("--base", default=BASE, help="flags every run has")
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--model", default="switch_base_tiny")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--layout", default="dp_ep")
    p.add_argument("--mesh", default="data:2,model:1,expert:4")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.model, args.steps, args.layout, args.mesh)))
        return {}
    if args.reps < 1:
        p.error(f"--reps {args.reps}: give 1 or more")
    sets = flag_sets(args.set)
    runs = {label: [] for label in sets}
    for _ in range(args.reps):
        for label, flags in sets.items():         # alternated: each set meets the same load
            env = {**os.environ, "JAX_PLATFORMS": "cpu",
                   "XLA_FLAGS": f"{args.base} {flags} --xla_force_host_platform_device_count=8"}
            proc = subprocess.run([sys.executable, __file__, "--child", "--set", "child=",
                                   "--model", args.model, "--steps", str(args.steps),
                                   "--layout", args.layout, "--mesh", args.mesh],
                                  capture_output=True, text=True, env=env)
            if proc.returncode:
                sys.exit(f"error: the run with XLA_FLAGS {flags!r} failed: "
                         f"{proc.stderr.strip().splitlines()[-1:]}")
            runs[label].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    result = {"benchmark": "compile_cpu", "machine": machine(), "base": args.base, "sets": sets,
              "model": args.model, "layout": args.layout, "mesh": args.mesh,
              "reps": args.reps, "runs": runs, "summary": summary(runs)}
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
