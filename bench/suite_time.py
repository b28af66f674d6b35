"""The test suite's time as CI meets it: `make test`'s pytest command on a clean clone of the
committed tree, its wall seconds against the 8-minute budget, and where the CPU goes (per test:
the test process's own CPU and that of the processes it started, and JAX's compile seconds;
summed per file). On a 2-core machine the suite is CPU-bound, so its CPU seconds are what a
change moves; this machine's speed drifts by ~10% between sittings and moves every file
alike, which --compare separates from a change by setting the same tests' CPU against an
earlier run's JSON (a change moves its own tests).

    python bench/suite_time.py [--workers 3] [--compare OLD.json] [--out F] [--tests PATH ...]

Stop other work on the machine first; nothing here is run by `make bench`.
"""
import collections
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import emit, machine, parser

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 480


def run_suite(clone: Path, tests: list[str], workers: int, rows_dir: Path) -> dict:
    """pytest over ``tests`` in ``clone``, as `make test` runs it, with bench/suite_cpu.py."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "suite_cpu", *tests]
    if workers:
        command[4:4] = ["-n", str(workers), "--dist", "worksteal"]
    plugin = rows_dir.parent / "plugin"     # this checkout's plugin, alone on the path
    plugin.mkdir()
    shutil.copy(Path(__file__).with_name("suite_cpu.py"), plugin)
    outer = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID",
             "PYTEST_CURRENT_TEST")        # a pytest this runs under (its own test) is not ours
    env = {**{k: v for k, v in os.environ.items() if k not in outer},
           "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "SUITE_CPU_OUT": str(rows_dir),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(plugin),
                                                       os.environ.get("PYTHONPATH")]))}
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    proc = subprocess.run(command, cwd=clone, env=env, capture_output=True, text=True)
    wall, after = time.monotonic() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = proc.stdout.strip().splitlines()
    return {"command": " ".join(["pytest", *command[3:]]), "returncode": proc.returncode,
            "summary": lines[-1] if lines else proc.stderr[-500:], "wall_s": round(wall, 1),
            "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime
                           - before.ru_stime, 1)}


COLUMNS = ("cpu_own", "cpu_children", "wall", "compile_s", "compiles", "worker", "outcome")


def cpu(row: dict) -> float:
    """A test's CPU seconds: its own process's and those of the processes it started."""
    return row["cpu_own"] + row["cpu_children"]


def per_test(rows_dir: Path) -> dict:
    rows = [r for f in sorted(rows_dir.glob("*.json")) for r in json.loads(f.read_text())]
    return {r["test"]: r for r in rows}


def packed(tests: dict) -> dict:
    """Each test's row as a list in COLUMNS' order (the JSON's ``tests``: ~700 rows)."""
    return {n: [r.get(c, "") for c in COLUMNS] for n, r in tests.items()}


def unpacked(tests: dict) -> dict:
    return {n: r if isinstance(r, dict) else {"test": n, **dict(zip(COLUMNS, r))}
            for n, r in tests.items()}


def summarise(tests: dict, top: int = 15) -> dict:
    files = collections.Counter()
    for name, r in tests.items():
        files[name.split("::")[0]] += cpu(r)
    workers = collections.defaultdict(set)
    for name, r in tests.items():
        workers[name.split("::")[0]].add(r.get("worker", ""))
    return {"failed": sorted(n for n, r in tests.items() if r.get("outcome") == "failed"),
            "tests_cpu_s": round(sum(map(cpu, tests.values())), 1),
            "files_on_several_workers": sorted(f for f, w in workers.items() if len(w) > 1),
            "children_cpu_s": round(sum(r["cpu_children"] for r in tests.values()), 1),
            "compile_s": round(sum(r["compile_s"] for r in tests.values()), 1),
            "files": {f: round(c, 1) for f, c in files.most_common()},
            "top_tests": [{"test": n, "cpu_s": round(cpu(r), 1), "wall_s": r["wall"]}
                          for n, r in sorted(tests.items(), key=lambda kv: -cpu(kv[1]))[:top]]}


def compare(tests: dict, old: dict) -> dict:
    """The tests both runs ran: their CPU here and there, and the files whose share moved."""
    then = {n: cpu(r) for n, r in unpacked(old["tests"]).items()}
    common = sorted(set(tests) & set(then))
    now_s, then_s = sum(cpu(tests[n]) for n in common), sum(then[n] for n in common)
    drift = now_s / then_s if then_s else None
    by_file = collections.defaultdict(lambda: [0.0, 0.0])
    for n in common:
        by_file[n.split("::")[0]][0] += cpu(tests[n])
        by_file[n.split("::")[0]][1] += then[n]
    moved = {f: {"now": round(a, 1), "then": round(b, 1), "ratio": round(a / b, 2),
                 "over_drift": round(a / b / drift, 2)}
             for f, (a, b) in by_file.items() if drift and b >= 0.01 * then_s}  # not the tiny
    return {"against": old.get("commit"), "common_tests": len(common),
            "cpu_s_now": round(now_s, 1), "cpu_s_then": round(then_s, 1),
            "drift": round(drift, 3) if drift else None,
            "new_tests_cpu_s": round(sum(cpu(tests[n]) for n in set(tests) - set(then)), 1),
            "files_moved_most": dict(sorted(moved.items(),
                                            key=lambda kv: -abs(kv[1]["over_drift"] - 1))[:10])}


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--workers", type=int, default=3, help="xdist workers, as `make test` "
                   "(0: no xdist)")
    p.add_argument("--tests", nargs="+", default=["tests"], help="what pytest runs")
    p.add_argument("--compare", type=Path, help="an earlier run's JSON")
    args = p.parse_args(argv)
    if args.workers < 0:
        p.error(f"--workers {args.workers}: give 0 (no xdist) or more")
    old = None
    if args.compare:                   # read before the suite runs, not after
        try:
            old = json.loads(args.compare.read_text())
            unpacked(old["tests"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"error: --compare {args.compare}: not a result of bench/suite_time.py "
                  f"({e!r}); give an earlier run's --out JSON", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="suite-time-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        if (ROOT.parent / "shared").is_dir():       # CI's layout: ../shared beside the clone
            (Path(tmp) / "shared").symlink_to(ROOT.parent / "shared")
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, check=True,
                                capture_output=True, text=True).stdout.strip()
        run = run_suite(clone, args.tests, args.workers, Path(tmp) / "rows")
        tests = per_test(Path(tmp) / "rows")
    result = {"benchmark": "suite_time", "commit": commit, "machine": machine(),
              "budget_s": BUDGET_S, **run, "within_budget": run["wall_s"] <= BUDGET_S,
              **summarise(tests), "tests_columns": list(COLUMNS), "tests": packed(tests)}
    if old:
        result["compare"] = compare(tests, old)
    if args.out:                       # every test's row in the file, the summary printed
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        rows = ",\n".join(f"  {json.dumps(n)}: {json.dumps(r)}"
                           for n, r in result["tests"].items())
        text = json.dumps({**result, "tests": "ROWS"}, indent=1)
        Path(args.out).write_text(text.replace('"ROWS"', "{\n" + rows + "\n }") + "\n")
    emit({k: v for k, v in result.items() if k != "tests"}, None)
    return 0 if run["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
