"""train.py / eval.py re-run themselves with glibc's huge-page tunable (commands/entry.py)."""
import os
import platform
import subprocess
import sys

import pytest

from switchzoo.commands import entry

MADVISE = "always [madvise] never\n"


def test_env_only_where_it_helps():
    env = entry.huge_pages_env({"A": "1"}, MADVISE, ("glibc", "2.36"))
    assert env == {"A": "1", "GLIBC_TUNABLES": entry.HUGE_PAGES}
    kept = entry.huge_pages_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, MADVISE,
                              ("glibc", "2.36"))
    assert kept["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:" + entry.HUGE_PAGES
    for environ, mode, libc in [
            ({"GLIBC_TUNABLES": entry.HUGE_PAGES}, MADVISE, ("glibc", "2.36")),   # already set
            ({"SWITCHZOO_HUGE_PAGES": "0"}, MADVISE, ("glibc", "2.36")),        # user said no
            ({}, "[always] madvise never", ("glibc", "2.36")),                 # kernel does it
            ({}, "always madvise [never]", ("glibc", "2.36")),                 # none allowed
            ({}, MADVISE, ("glibc", "2.31")),                                  # no such tunable
            ({}, MADVISE, ("", ""))]:                                          # not glibc
        assert entry.huge_pages_env(environ, mode, libc) is None


@pytest.mark.parametrize("mode", [MADVISE, "[always] madvise never\n"])
def test_the_command_reruns_itself_with_its_options_and_arguments(tmp_path, mode):
    """A script calling use_huge_pages() (THP mode read from a file the test writes) runs
    again with the tunable where the mode is madvise, keeping python's -u and its arguments;
    where the mode needs no help it runs once, unchanged."""
    libc, version = platform.libc_ver()
    if sys.platform != "linux" or entry.huge_pages_env({}, MADVISE, (libc, version)) is None:
        pytest.fail(f"this test needs Linux with glibc >= 2.35 (here: {sys.platform}, "
                    f"{libc} {version})")
    thp = tmp_path / "enabled"
    thp.write_text(mode)
    script = tmp_path / "show.py"
    script.write_text(
        "import os, sys\nprint('start', flush=True)\nfrom switchzoo.commands import entry\n"
        f"entry.use_huge_pages({str(thp)!r})\n"
        "print(os.environ.get('GLIBC_TUNABLES', ''), '-u' in sys.orig_argv, sys.argv[1:])\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("GLIBC_TUNABLES", "SWITCHZOO_HUGE_PAGES")}
    out = subprocess.run([sys.executable, "-u", str(script), "--x=1"], env=env, check=True,
                         capture_output=True, text=True).stdout.splitlines()
    if mode == MADVISE:
        assert out == ["start", "start", f"{entry.HUGE_PAGES} True ['--x=1']"]
    else:
        assert out == ["start", " True ['--x=1']"]
