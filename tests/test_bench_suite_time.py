"""bench/suite_time.py on a two-test file: it runs pytest on a clean clone with its plugin, each
test's CPU counts the process it started, and --compare sets the same tests against an earlier
run (here one whose every test took twice the CPU: a drift of 0.5, no file moved beyond it)."""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

TESTS = '''
import subprocess, sys

def test_starts_a_process():
    subprocess.run([sys.executable, "-c", "sum(range(60_000_000))"], check=True)

def test_alone():
    assert sum(range(10)) == 45
'''


def suite_time(tmp_path, *flags):
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "bench/suite_time.py", "--workers", "0", "--tests",
                           str(tmp_path / "test_two.py"), "--out", str(out), *flags],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_a_run_counts_each_tests_processes_and_compares(tmp_path):
    (tmp_path / "test_two.py").write_text(TESTS)
    r = suite_time(tmp_path)
    assert r["returncode"] == 0 and "2 passed" in r["summary"] and r["within_budget"]
    assert r["tests_columns"][:2] == ["cpu_own", "cpu_children"]
    alone, started = ({"test": n, **dict(zip(r["tests_columns"], r["tests"][n]))}
                      for n in sorted(r["tests"]))
    assert started["test"].endswith("test_starts_a_process") and started["cpu_children"] > 0.1
    assert alone["cpu_children"] == 0 and r["cpu_s"] >= r["tests_cpu_s"] > 0.1
    assert list(r["files"]) == [started["test"].split("::")[0]]
    assert r["files_on_several_workers"] == [] and started["worker"] == ""     # no xdist
    assert r["failed"] == [] and started["outcome"] == alone["outcome"] == "passed"

    then = {**r, "tests": {n: [2 * t[0], 2 * t[1], *t[2:]] for n, t in r["tests"].items()}}
    (tmp_path / "then.json").write_text(json.dumps(then))
    again = suite_time(tmp_path, "--compare", str(tmp_path / "then.json"))["compare"]
    assert again["common_tests"] == 2 and again["new_tests_cpu_s"] == 0
    assert 0.2 < again["drift"] < 1.0           # ~0.5, times the second run's own noise
    (moved,) = again["files_moved_most"].values()
    assert moved["over_drift"] == 1.0             # the one file moved as the whole run
