"""A pytest plugin for bench/suite_time.py: each test's CPU seconds (its own process's, and the
processes it started and waited for), wall seconds and JAX compile seconds, one JSON file per
test process in $SUITE_CPU_OUT. Loaded with ``-p suite_cpu`` (this folder on PYTHONPATH); the
xdist workers load it too."""
import json
import os
import resource
import sys
import time

import pytest

_rows: list = []
_compile = [0.0, 0]                  # seconds, programs
_listening = [False]
_outcome: set = set()            # the current test's: passed / failed (any phase)


def _on_duration(event: str, duration: float, **_) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _compile[0] += duration
        _compile[1] += 1


def _cpu() -> tuple[float, float]:
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                           resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _listening[0] and "jax" in sys.modules:     # tests/conftest.py imports it
        import jax.monitoring
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _listening[0] = True
    (own, children), wall, (seconds, programs) = _cpu(), time.monotonic(), tuple(_compile)
    _outcome.clear()
    yield
    own2, children2 = _cpu()
    _rows.append({"test": item.nodeid, "cpu_own": round(own2 - own, 3),
                  "cpu_children": round(children2 - children, 3),
                  "wall": round(time.monotonic() - wall, 3),
                  "compile_s": round(_compile[0] - seconds, 3),
                  "compiles": _compile[1] - programs,
                  # which xdist worker: a module whose tests two workers ran built its
                  # module-scoped fixtures twice
                  "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
                  "outcome": "failed" if "failed" in _outcome else "passed"
                  if _outcome else "skipped"})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.failed or (report.when == "call" and report.passed):
        _outcome.add("failed" if report.failed else "passed")


def pytest_sessionfinish(session):
    out = os.environ.get("SUITE_CPU_OUT")
    if out and _rows:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"{os.getpid()}.json"), "w") as f:
            json.dump(_rows, f)
