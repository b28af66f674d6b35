"""Simulated CPU devices for a program that needs a mesh this machine does not have (the
inspector, the dry run, the layout search): set JAX's CPU device count while it still can be
set, else run the program again in a process that starts with them."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import jax

_RERUN = "_SWITCHZOO_DEVICES_RERUN"      # set in a process started on simulated devices


def use_cpu_devices(n: int) -> bool:
    """Makes JAX run on ``n`` simulated CPU devices; False if that is too late in this process.

    Importing jax does not start a backend: it starts on first use (``jax.devices()``, the first
    array), and ``jax_num_cpu_devices`` can be set until then. Once a backend is running (as in
    a test session or a notebook) it cannot change; True if it already has ``n`` devices."""
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:              # "should be updated before backends are initialized"
        return jax.device_count() == n
    jax.config.update("jax_platforms", "cpu")
    return True


def rerun_on_devices(command: list[str], n: int) -> int:
    """Runs ``command`` (this program again) in a fresh process that starts JAX on ``n``
    simulated CPU devices; its exit code (2, with a message, if even that process lacks them)."""
    if os.environ.get(_RERUN) == str(n):
        print(f"error: JAX did not start with {n} devices (it has {jax.device_count()})",
              file=sys.stderr)
        return 2
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "",
                   os.environ.get("XLA_FLAGS", ""))
    env = dict(os.environ, JAX_PLATFORMS="cpu", **{_RERUN: str(n)},
               XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count={n}".strip())
    sys.stdout.flush()
    return subprocess.run(command, env=env).returncode
