"""Tests run on 8 simulated CPU devices; the flag must be set before JAX is imported."""
import atexit
import fcntl
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

# Tests prove what programs compute, not how fast they run: XLA's CPU backend skips LLVM's
# optimisation passes, which halves compile times here (the compile-heavy mesh-equivalence and
# dropless tests: 145 s -> 77 s). Results stay within every test's tolerance, and bitwise
# comparisons (resume, multi-process) compare programs built with the same flags. bench/ never
# sets it. Tests that start processes with their own XLA_FLAGS pass this on (FAST_COMPILE).
FAST_COMPILE = "--xla_backend_optimization_level=0"
# XLA:CPU's older loop emitters instead of its fusion emitters (the default since 2025): a
# quarter less compile time again (a Switch train step and its init: 7.6 -> 5.5 s of CPU; the
# suite: ~1,000 -> ~710 s of CPU on this 2-core machine). Only where this XLA still has the
# flag: XLA aborts a process on a flag it does not know, so a probe process (~0.7 s) asks.
LEGACY_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
# XLA:CPU's code generation in one piece: by default it splits each program's LLVM module to
# compile the parts on parallel threads, which on this 2-core machine, shared by three test
# workers, costs more CPU than it saves (a Switch train step's process: 8.3 -> 6.8 s of CPU, the
# mean of six alternating runs each; test_mesh_equivalence + test_pipeline: 100 -> 94 s, two
# each). The same code results.
ONE_CODEGEN_PART = "--xla_cpu_parallel_codegen_split_count=1"


def _xla_knows(flags: str) -> bool:
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"],
                           env={**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"},
                           capture_output=True, timeout=120)
    return probe.returncode == 0


# (The xdist workers inherit the first process's XLA_FLAGS, and with them its answer.) One probe
# process asks for both flags; only where XLA refuses the pair is each asked alone.
_OPTIONAL = (LEGACY_EMITTERS, ONE_CODEGEN_PART)
if all(f in os.environ.get("XLA_FLAGS", "") for f in _OPTIONAL) or _xla_knows(
        " ".join(_OPTIONAL)):
    FAST_COMPILE += " " + " ".join(_OPTIONAL)
else:
    FAST_COMPILE += "".join(f" {f}" for f in _OPTIONAL
                            if f in os.environ.get("XLA_FLAGS", "") or _xla_knows(f))
_flags = os.environ.get("XLA_FLAGS", "").split()
os.environ["XLA_FLAGS"] = " ".join(_flags + [f for f in FAST_COMPILE.split() if f not in _flags]
                                   + ["--xla_force_host_platform_device_count=8"])
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache per test session, for every train.py / eval.py process the
# tests start (the test processes themselves write only their larger programs: below): the
# resume, preemption and multi-process tests compile the same steps again in new processes, and
# load them from here instead. It only saves time: a cache entry is the executable XLA would
# have built for the same program and devices. Beside
# it, the session's $SWITCHZOO_CACHE (what switchzoo.data.memo keeps: tokenizers trained on the
# embedded corpus, harvested catalogues; the layout search's compiles), so nothing reaches the
# machine's ~/.cache; a hit is the bytes a rebuild gives (tests/test_data.py checks).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:      # the first process of the session
    _caches = tempfile.mkdtemp(prefix="switchzoo-test-caches-")
    atexit.register(shutil.rmtree, _caches, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(_caches, "jax")
    os.environ.setdefault("SWITCHZOO_CACHE", os.path.join(_caches, "switchzoo"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# No Python traceback frames in the programs' source locations (JAX keeps up to 100 per
# operation): tracing, lowering and XLA's passes all carry them, and no test reads them (a
# train step's trace + lower + compile: 3.1 -> 2.3 s of CPU). Operation names (named scopes,
# which the inspector and the profiles read) are kept. The processes the tests start inherit it.
os.environ.setdefault("JAX_TRACEBACK_IN_LOCATIONS_LIMIT", "0")
# The train.py / eval.py processes the tests start run once, without re-running themselves for
# glibc's huge pages (a second interpreter start per process, and THP compaction on the many
# short, memory-heavy processes of the multi-process and kill/resume tests: ~25 s of the suite
# here). tests/test_huge_pages.py tests the re-run itself with the variable removed.
os.environ.setdefault("SWITCHZOO_HUGE_PAGES", "0")
# Idle threads that sleep instead of spinning. torch (the Hugging Face oracle) runs its ops on
# OpenMP threads that, by default, spin while they wait for work; on this 2-core machine,
# shared by three test workers and the processes they start, a waiting thread spins through
# the other processes' time slices (one transformers generate of a tiny Switch model: 0.1 to
# 14 s of CPU from run to run, 0.2 s when its threads sleep instead; test_hf, test_hf_export,
# test_decoding, test_t5x and test_bench_peer: 110 -> 66 s). numpy's OpenBLAS threads spin
# ~0.1 s after each threaded call and at every start (~40% of an `import numpy`'s CPU): 2^4
# cycles instead of 2^28 before they sleep. Either changes when an idle thread wakes, not which
# threads compute what: the same results. Read when each runtime loads (torch: after this,
# conftest.Lazy; numpy: jax below), and by the processes the tests start.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
# Bytecode kept (beside the sources, in the __pycache__ folders git ignores) where the machine
# says otherwise (PYTHONDONTWRITEBYTECODE=1 here): each of the ~60 processes the tests start
# would compile switchzoo's sources again (~0.15 s of CPU each), and each xdist worker its test
# modules after pytest rewrites their asserts (~1.3 s). The sources decide; nothing else changes.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

import gc  # noqa: E402

import jax  # noqa: E402

# Python's cycle collector, at its default thresholds, runs ~3,000 times while a test file traces
# and lowers JAX programs (each trace allocates hundreds of thousands of small objects): ~5% of a
# test process's CPU. Here the youngest generation waits for 70x more allocations: ~10x fewer
# collections (test_mesh_equivalence + test_decoding: 3,221 -> 346, 4.2 -> 0.6 s).
gc.set_threshold(50_000, 50, 100)
# ... and so do the processes they start (train.py, eval.py, the benches: tests/site).
_site = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
if _site not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_site, os.environ.get("PYTHONPATH")]))

# The test processes themselves write only programs that took a second or more to compile (a
# train step that a test builds again in the same process, e.g. a resumed loop.train): most of
# their ~2,800 programs are small and compiled once, and serialising and writing each entry
# costs ~9% of its compile. The processes the tests start write every program (above): each
# train.py process reads its ~11 programs back from the one before it (~3 s of CPU each).
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)

assert jax.device_count() == 8, "tests need 8 simulated devices: set XLA_FLAGS before jax loads"


# The longest tests start first: pytest-xdist's worksteal hands each worker a contiguous half
# of the list and lets an idle worker take from the end of the other's, so a long test left
# near the end would run alone while the other worker idles (the 2-process test: ~100 s).
FIRST = ("test_bench_gpu.py::test_smoke", "test_multiprocess.py::test_two_processes",
         "test_reliability.py::test_sigkill", "test_end_to_end.py::test_train_resume")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not any(f in item.nodeid for f in FIRST))


def built_once(tmp_path_factory, name: str, build) -> pathlib.Path:
    """``build(folder)`` (it fills the empty ``folder`` and returns the path it made), run once
    per test session: a module-scoped fixture is built once per process, and worksteal may
    hand a module's tests to every xdist worker (tests/test_faults.py's trained run: built by
    all three). Under xdist the first worker to ask builds it in the session's shared
    temporary folder while the others wait on a lock, then all read the same files; tests
    must not change them (they work on copies). Without xdist, a plain temporary folder."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent / f"built-once-{name}"
    shared.mkdir(exist_ok=True)
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)              # released when the file closes
        record = shared / "built"
        if not record.exists():
            folder = shared / "folder"
            shutil.rmtree(folder, ignore_errors=True)     # left by a worker whose build failed
            folder.mkdir()
            record.write_text(str(build(folder)))
        return pathlib.Path(record.read_text())


class Lazy:
    """Module ``name``, imported at its first attribute: torch and transformers (the Hugging
    Face oracle, ~6 s of CPU to import) are read by four test modules, and every xdist worker
    imports every test module to collect it; a worker that runs none of their tests no longer
    pays for them."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("_"):       # pytest's collection probes names such as _mock_name
            raise AttributeError(attr)
        import importlib
        return getattr(importlib.import_module(self._name), attr)
