"""train.py / eval.py re-run themselves with glibc's huge-page tunable (switchzoo.cli)."""
import os
import pathlib
import platform
import subprocess
import sys

from switchzoo import cli

MADVISE = "always [madvise] never\n"


def test_env_only_where_it_helps():
    env = cli.huge_pages_env({"A": "1"}, MADVISE, ("glibc", "2.36"))
    assert env == {"A": "1", "GLIBC_TUNABLES": cli.HUGE_PAGES}
    kept = cli.huge_pages_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, MADVISE,
                              ("glibc", "2.36"))
    assert kept["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:" + cli.HUGE_PAGES
    for environ, mode, libc in [
            ({"GLIBC_TUNABLES": cli.HUGE_PAGES}, MADVISE, ("glibc", "2.36")),   # already set
            ({"SWITCHZOO_HUGE_PAGES": "0"}, MADVISE, ("glibc", "2.36")),        # user said no
            ({}, "[always] madvise never", ("glibc", "2.36")),                 # kernel does it
            ({}, "always madvise [never]", ("glibc", "2.36")),                 # none allowed
            ({}, MADVISE, ("glibc", "2.31")),                                  # no such tunable
            ({}, MADVISE, ("", ""))]:                                          # not glibc
        assert cli.huge_pages_env(environ, mode, libc) is None


def test_reexec_sets_the_tunable(tmp_path):
    """A script calling use_huge_pages() sees the tunable in its environment afterwards (where
    this machine allows it) and keeps its arguments."""
    script = tmp_path / "show.py"
    script.write_text("import os, sys\nfrom switchzoo import cli\ncli.use_huge_pages()\n"
                      "print(os.environ.get('GLIBC_TUNABLES', ''), sys.argv[1:])\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("GLIBC_TUNABLES", "SWITCHZOO_HUGE_PAGES")}
    out = subprocess.run([sys.executable, str(script), "--x=1"], env=env, check=True,
                         capture_output=True, text=True).stdout.strip()
    try:
        mode = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        mode = ""
    expected = cli.huge_pages_env(env, mode, platform.libc_ver()) if sys.platform == "linux" \
        else None
    want = expected["GLIBC_TUNABLES"] if expected else ""
    assert out == f"{want} ['--x=1']"
