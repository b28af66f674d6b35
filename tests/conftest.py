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

