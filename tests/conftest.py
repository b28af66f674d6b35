"""Tests run on 8 simulated CPU devices; the flag must be set before JAX is imported."""
import os
import tempfile

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache per test session (shared by the xdist workers and every
# train.py process the tests start): the resume, preemption and multi-process tests compile the
# same steps again in new processes, and load them from here instead. It only saves time: a
# cache entry is the executable XLA would have built for the same program and devices.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    tempfile.gettempdir(),
    f"switchzoo-test-jax-cache-{os.environ.get('PYTEST_XDIST_TESTRUNUID', os.getpid())}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

import jax  # noqa: E402

assert jax.device_count() == 8, "tests need 8 simulated devices: set XLA_FLAGS before jax loads"


# The longest tests (seconds each, on 2 cores) start first, alternating between the two halves
# of the collection that pytest-xdist's worksteal hands its two workers, so that neither worker
# is left with a long test at the end while the other idles. Only the order changes.
LONGEST_FIRST = (
    "test_multiprocess.py::", "test_bench.py::test_train_step_bench",
    "test_reliability.py::test_sigkill", "test_mesh_equivalence.py::test_accumulation",
    "test_reliability.py::test_sigterm", "test_end_to_end.py::test_train_resume",
    "test_install.py::", "test_mesh_equivalence.py::test_encoder_decoder",
    "test_bench.py::test_memory_bench", "test_train.py::test_loss_falls",
)


def _rank(item) -> int:
    return next((i for i, key in enumerate(LONGEST_FIRST) if key in item.nodeid),
                len(LONGEST_FIRST))


def pytest_collection_modifyitems(config, items):
    long = sorted((i for i in items if _rank(i) < len(LONGEST_FIRST)), key=_rank)
    rest = [i for i in items if _rank(i) == len(LONGEST_FIRST)]
    first, second = long[0::2], long[1::2]
    cut = max(len(items) // 2 - len(first), 0)
    items[:] = first + rest[:cut] + second + rest[cut:]
