"""Runs every benchmark, one process each, then writes the report.

    python bench/run_all.py [--out out/bench] [--only train_step,memory] [--quick]

Each script's JSON lands in --out; bench/report.py then rewrites the results part of
docs/benchmarks.md and its plots in docs/figures/. Run it on an otherwise idle machine: every
ratio is measured within one process, but a busy machine still adds noise.
"""
import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# name: (script, extra flags, extra flags with --quick)
BENCHES = {
    "train_step": ("train_step.py", [], ["--layers", "2", "--d-model", "256", "--repeats", "2",
                                        "--compiles", "1"]),
    "memory": ("memory.py", [], ["--tokens", "2048", "--d-model", "256"]),
    "pipeline": ("pipeline.py", [], ["--seconds", "3", "--max-pairs", "4000",
                                     "--host-seconds", "1", "--hosts", "1,256"]),
    "peer": ("peer_series.py", [], ["--runs", "1", "--", "--quick"]),
    "decode": ("decode.py", [], ["--new", "16"]),
    "input_overlap": ("input_overlap.py", [], ["--quick"]),
    "flops": ("flops.py", [], ["--batch", "8", "--length", "128"]),
    "lm_step": ("lm_step.py", [], ["--repeats", "2"]),
    "pod": ("pod.py", [], ["--cases", "switch_tiny:8", "--length", "32"]),
    "pipeline_parallel": ("pipeline_parallel.py", [], ["--layers", "4", "--rows", "8",
                                                       "--length", "32",
                                                       "--schedules", "1x1x1,2x2x1"]),
}


def main():
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--out", default="out/bench", help="folder for the JSON results")
    p.add_argument("--only", default="", help="comma-separated subset of " + ",".join(BENCHES))
    p.add_argument("--quick", action="store_true", help="small sizes: checks the scripts run")
    p.add_argument("--no-report", action="store_true", help="skip docs/benchmarks.md")
    args = p.parse_args()
    names = [n for n in args.only.split(",") if n] or list(BENCHES)
    unknown = sorted(set(names) - set(BENCHES))
    if unknown:
        sys.exit(f"error: unknown benchmark(s) {unknown}; choose from {', '.join(BENCHES)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in names:
        script, flags, quick = BENCHES[name]
        cmd = [sys.executable, str(HERE / script), "--out", str(out / f"{name}.json"), *flags,
               *(quick if args.quick else [])]
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        start = time.perf_counter()
        if subprocess.run(cmd).returncode:
            failed.append(name)
        print(f"== {name}: {time.perf_counter() - start:.0f} s", flush=True)
    if not args.no_report and not args.quick:
        subprocess.run([sys.executable, str(HERE / "report.py"), "--results", str(out)],
                       check=True)
    if failed:
        sys.exit(f"error: benchmark(s) failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
