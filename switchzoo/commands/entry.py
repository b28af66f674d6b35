"""The entry points of train.py / eval.py and the installed switchzoo-train / switchzoo-eval:
each first re-runs the process with glibc's huge-page tunable (huge_pages_env), then imports and
runs its command (commands/train.py, commands/eval.py). Nothing heavy is imported before the
re-run, and a missing dependency (python outside the project's environment) is one line."""
from __future__ import annotations

import gc
import importlib
import os
import pathlib
import sys


HUGE_PAGES = "glibc.malloc.hugetlb=1"


def huge_pages_env(environ, thp_mode: str, libc: tuple[str, str]) -> dict | None:
    """The environment to re-run this process in so that glibc's malloc asks for transparent
    huge pages, or None where that changes nothing or the user said no.

    XLA:CPU allocates each step's temporaries afresh, and glibc serves allocations this large
    with new mmaps: every step touched ~36,000 fresh 4 KiB pages at the peer bench's config
    (docs/benchmarks.md), 5-15% of a step. With the tunable, malloc madvises huge
    pages (~110 faults per step). glibc reads tunables only at start-up, hence a re-run. Only
    where the kernel's THP mode is ``madvise`` (``always`` needs no help, ``never`` allows
    none), glibc >= 2.35 (the tunable's first release), and SWITCHZOO_HUGE_PAGES is not 0."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    if environ.get("SWITCHZOO_HUGE_PAGES", "1") == "0" or "glibc.malloc.hugetlb" in tunables:
        return None
    name, version = libc
    try:
        new_enough = name == "glibc" and tuple(map(int, version.split(".")[:2])) >= (2, 35)
    except ValueError:
        new_enough = False
    if "[madvise]" not in thp_mode or not new_enough:
        return None
    return {**environ, "GLIBC_TUNABLES": ":".join(filter(None, [tunables, HUGE_PAGES]))}


THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


def use_huge_pages(thp_mode: str = THP_MODE) -> None:
    """Re-runs this command (same interpreter, its options such as ``-u`` and the same
    arguments) with huge_pages_env's environment, before anything is allocated; a no-op where
    that returns None, and where the re-run cannot start (the command then goes on as is)."""
    import platform
    if sys.platform != "linux":
        return
    try:
        mode = pathlib.Path(thp_mode).read_text()
    except OSError:
        return
    env = huge_pages_env(os.environ, mode, platform.libc_ver())
    if env is not None and sys.argv and pathlib.Path(sys.argv[0]).is_file():
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
        except OSError:
            return


def train() -> None:
    """The ``switchzoo-train`` / train.py entry: huge pages first, then the command."""
    use_huge_pages()
    _command("train").run()


def evaluate() -> None:
    """The ``switchzoo-eval`` / eval.py entry."""
    use_huge_pages()
    _command("eval").run()


def _command(name: str):
    """switchzoo.commands.NAME, or exit 2 with one line where a package it needs is missing
    (a ModuleNotFoundError of switchzoo's own modules is a bug, and stays a traceback)."""
    try:
        command = importlib.import_module(f"switchzoo.commands.{name}")
    except ModuleNotFoundError as e:
        if not e.name or e.name.partition(".")[0] == "switchzoo":
            raise
        print(f"error: the Python package '{e.name.partition('.')[0]}' is not installed for "
              f"{sys.executable}: use the project's environment (source .venv/bin/activate, or "
              "run .venv/bin/python; make demo creates it)", file=sys.stderr)
        sys.exit(2)
    # What the imports made (JAX, Flax, Orbax, ...: ~160,000 tracked objects) lives as long as
    # the process: out of the cycle collector's reach, full collections while the step is traced
    # and compiled stop scanning it (GC time of a tiny train.py run: 0.55 -> 0.32 s of ~5 s).
    gc.freeze()
    return command
