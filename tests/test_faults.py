"""What a shared cluster does to a run, with real processes and real filesystems (issue 34):
a second train.py on a running run's workdir, eval.py reading it meanwhile, Ctrl-C (once: a
preemption; twice: stop at once; during the start: the workdir as it was), a disk that fills
(a small tmpfs) and a read-only mount (a read-only bind mount). Every fault ends in a correct
result or one 'error: ...' line with a non-zero exit, and the same command resumes after it.

No wall-clock deadlines: each wait is for something the run writes (a step in metrics.jsonl, a
committed checkpoint, a line on stderr); WAIT only keeps a broken run from hanging the suite.
Mounting needs root (CI runs as root): where it is refused, the full-disk test is skipped (no
other way to fill a real filesystem) and the read-only test uses ``chmod a-w`` instead, which
a user other than root cannot write through."""
import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import built_once
from test_reliability import ENV, ROOT, command, committed, steps_logged

WAIT = 300          # seconds: only against a hang, never a measure of speed


def wait_for(condition, proc=None, what=""):
    end = time.monotonic() + WAIT
    while not condition():
        assert proc is None or proc.poll() is None, (what, proc.communicate())
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.05)


def start(workdir, steps, every):
    """train.py as a person at a terminal starts it: with Ctrl-C's default action, whatever
    the test session inherited (a background or nohup'd session ignores SIGINT, and train.py
    keeps an ignored signal ignored). A signal with a handler here starts with its default
    action in the new program, so Ctrl-C gets one for the moment of the start (not a preexec_fn:
    that makes subprocess fork this multithreaded process, which Python warns against)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(command(workdir, steps, every), cwd=ROOT, env=ENV, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    finally:
        signal.signal(signal.SIGINT, before)


def run(argv, code):
    out = subprocess.run(argv, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=WAIT)
    assert out.returncode == code, (out.returncode, out.stderr[-3000:])
    return out


def one_error_line(stderr: str) -> str:
    """The one 'error: ...' line a fault ends in (a progress bar may precede it, on its line)."""
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    lines = [x for x in stderr.replace("\r", "\n").splitlines() if x.strip()]
    assert lines and lines[-1].startswith("error: "), stderr[-3000:]
    assert sum(x.startswith("error: ") for x in lines) == 1, stderr[-3000:]
    return lines[-1]


def eval_command(workdir, *flags):
    return [sys.executable, "eval.py", f"--workdir={workdir}", *flags]


def snapshot(workdir) -> dict:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns, p.is_dir())
            for p in pathlib.Path(workdir).rglob("*")}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny run trained to step 4 (checkpoints 2 and 4), copied or mounted by each test;
    trained once per session, whichever xdist workers run these tests (conftest.built_once)."""
    def train(folder):
        run(command(folder / "run", 4, 2), 0)
        return folder / "run"
    return built_once(tmp_path_factory, "faults", train)


def copy_of(trained, where):
    shutil.copytree(trained, where)
    return where


def test_one_writer_eval_reads_a_training_run_and_ctrl_c_is_a_preemption(trained, tmp_path):
    workdir = copy_of(trained, tmp_path / "run")
    first = start(workdir, 400, 5)
    wait_for(lambda: 5 in committed(workdir), first, "checkpoint 5")
    # A second train.py on the same workdir, while the first is held still: one line naming
    # the holder, and not one file created or modified.
    first.send_signal(signal.SIGSTOP)
    try:
        before = snapshot(workdir)
        second = run(command(workdir, 400, 5), 2)
        line = one_error_line(second.stderr)
        assert "is in use" in line and f"pid {first.pid} on host " in line, line
        assert snapshot(workdir) == before
    finally:
        first.send_signal(signal.SIGCONT)
    # eval.py reads the run while it trains: a committed checkpoint, never a partial one.
    evaluated = run(eval_command(workdir), 0)
    step = json.loads((workdir / "results.json").read_text())["step"]
    assert step % 5 == 0 and step >= 5, evaluated.stdout
    # Ctrl-C: the current step is checkpointed, exit 0, no traceback.
    seen = max(steps_logged(workdir))
    wait_for(lambda: max(steps_logged(workdir)) > seen, first, "a step after eval")
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=WAIT)
    assert first.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    stopped = max(committed(workdir))
    assert f"preempted: saved step {stopped}" in out and stopped == max(steps_logged(workdir))
    assert not (workdir / "train.lock").exists()
    # The same command resumes there; a second Ctrl-C stops at once: exit 130, one line.
    again = start(workdir, 400, 5)
    said = []                          # stderr, read as it comes: the second Ctrl-C follows the
    reader = threading.Thread(        # first as soon as the run says it took it, while it saves
        target=lambda: said.extend(iter(lambda: os.read(again.stderr.fileno(), 1 << 16), b"")))
    reader.start()
    wait_for(lambda: max(steps_logged(workdir)) > stopped, again, "a resumed step")
    again.send_signal(signal.SIGINT)
    wait_for(lambda: b"interrupted: saving this step" in b"".join(said), again, "the first one")
    again.send_signal(signal.SIGINT)
    again.wait(timeout=WAIT)
    reader.join()
    err = b"".join(said).decode()
    assert f"resuming at step {stopped}" in again.stdout.read()
    assert again.returncode == 130, (again.returncode, err[-3000:])
    assert one_error_line(err).startswith("error: interrupted again: stopped at once")
    assert stopped in committed(workdir)          # no committed checkpoint lost


@pytest.mark.parametrize("removed", ["whole", "half"])
def test_eval_chooses_again_when_the_run_rotates_its_chosen_checkpoint_away(
        trained, tmp_path, monkeypatch, removed):
    """The race of eval.py reading a live run: it chose the newest step, then the run committed
    a newer one and rotated the chosen one away (keep_checkpoints) before it was read, the
    step's directory gone or still being deleted (CI's errno 2 on a file of the chosen step).
    Without a pinned step it restores the new newest; a pinned step that vanishes is one
    line."""
    import jax
    import numpy as np
    from switchzoo import checkpoints, evaluate, state, weights

    workdir = copy_of(trained, tmp_path / "run")
    config = evaluate.load_config(workdir)
    read = checkpoints.Checkpoints.restore_params
    chosen = []

    def rotated_while_read(self, step, abstract, shardings):
        if not chosen:      # the first read: the writer commits a newer step, deletes the chosen
            chosen.append(step)
            held = self.directory
            newer = max(int(p.name) for p in held.iterdir() if p.name.isdigit()) + 2
            shutil.copytree(held / str(step), held / str(newer))
            if removed == "whole" or step == config.get("restore_step"):
                shutil.rmtree(held / str(step))
            else:                                   # mid-rmtree: the step's folder stays
                shutil.rmtree(held / str(step) / "params")
        return read(self, step, abstract, shardings)
    monkeypatch.setattr(checkpoints.Checkpoints, "restore_params", rotated_while_read)
    layout = state.run_layout(config)
    _, params, step = evaluate.restore_params(config, workdir, layout, 300)
    assert (chosen, step) == ([4], 6)
    monkeypatch.setattr(checkpoints.Checkpoints, "restore_params", read)
    _, again, _ = evaluate.restore_params(config, copy_of(trained, tmp_path / "again"), layout,
                                          300)                   # what checkpoint 4 holds
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params),
                                                     jax.tree.leaves(again)))
    # The same through a run named as weights (eval.py --checkpoint, init_from).
    chosen.clear()
    monkeypatch.setattr(checkpoints.Checkpoints, "restore_params", rotated_while_read)
    origin = weights.resolve(copy_of(trained, tmp_path / "weights"))
    origin.load(state.setup(origin.cfg, layout))
    assert (chosen, origin.loaded["step"]) == ([4], 6)
    # A pinned step is never swapped for another: its removal is one line naming the fix.
    chosen.clear()
    monkeypatch.setattr(checkpoints.Checkpoints, "restore_params", rotated_while_read)
    config.restore_step = 2
    with pytest.raises(ValueError, match=r"checkpoint 2 in .* was removed while it was read"):
        evaluate.restore_params(config, workdir, layout, 300)


@pytest.mark.parametrize("existing", [False, True])
def test_ctrl_c_during_the_start_leaves_the_workdir_as_it_was(tmp_path, existing):
    workdir = tmp_path / "new" / "run"
    if existing:                      # the user's own file stays, and nothing else is left
        workdir.mkdir(parents=True)
        (workdir / "notes.txt").write_text("mine\n")
    proc = start(workdir, 400, 5)
    wait_for(lambda: (workdir / "data").exists(), proc, "the start's first files")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    assert "before training began" in one_error_line(err)
    if existing:
        assert sorted(p.name for p in workdir.iterdir()) == ["notes.txt"]
    else:
        assert not (tmp_path / "new").exists()


def mount(*argv) -> bool:
    return os.geteuid() == 0 and subprocess.run(["mount", *argv], capture_output=True).returncode == 0


@contextlib.contextmanager
def small_disk(tmp_path, size: str):
    """A real tmpfs of ``size`` at tmp_path/disk while the block runs (skipped where mounting
    is refused: not root)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if not mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)):
        pytest.skip("mounting a tmpfs is refused here (not root): no real disk to fill")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def fill(directory, leave: int) -> pathlib.Path:
    """A filler file that leaves ``leave`` bytes free on ``directory``'s filesystem."""
    stat = os.statvfs(directory)
    filler = pathlib.Path(directory) / "filler"
    filler.write_bytes(b"\0" * max(stat.f_bavail * stat.f_frsize - leave, 0))
    return filler


def test_a_full_disk_stops_in_one_line_keeps_the_checkpoint_and_resumes(trained, tmp_path):
    with small_disk(tmp_path, "24m") as disk:
        workdir = disk / "run"
        shutil.copytree(trained, workdir, ignore=shutil.ignore_patterns("2", "results.json"))
        (disk / "no-catalogues").mkdir()
        filler = fill(disk, 1 << 20)            # a checkpoint of this run takes ~4.7 MB
        out = run(command(workdir, 8, 2), 2)
        line = one_error_line(out.stderr)
        assert line.startswith(f"error: no space left on device writing checkpoint 6 in "
                               f"{workdir / 'checkpoints'}: it needs ~4.") and "MB free" in line
        assert "step 4 is the newest committed checkpoint" in line, line
        assert committed(workdir) == {4}
        assert not [p for p in (workdir / "checkpoints").iterdir() if not p.name.isdigit()]
        for row in (workdir / "metrics.jsonl").read_text().splitlines():
            json.loads(row)                     # no line cut
        filler.unlink()                         # space freed: the same command resumes
        out = run(command(workdir, 8, 2), 0)
        assert "resuming at step 4" in out.stdout and max(committed(workdir)) == 8
        # eval output on a full disk: one line, no partial results file left
        filler = fill(disk, 0)
        out = run(eval_command(workdir, f"--output={disk / 'results'}"), 2)
        line = one_error_line(out.stderr)
        assert line.startswith("error: no space left on device writing ") and \
            "results.json" in line, line
        assert not [p for p in (disk / "results").iterdir()] if (disk / "results").exists() \
            else True
        # a start on a full disk: one line, config.json as it was
        config = (workdir / "config.json").read_bytes()
        line = one_error_line(run(command(workdir, 10, 2), 2).stderr)
        assert line.startswith("error: no space left on device writing "), line
        assert (workdir / "config.json").read_bytes() == config
        assert not [p for p in workdir.iterdir() if p.name.endswith(".tmp")]


def test_metrics_lines_are_whole_or_absent_on_a_full_disk(tmp_path):
    from switchzoo import atomic, workdir
    with small_disk(tmp_path, "64k") as disk:
        path = disk / "metrics.jsonl"
        line = json.dumps({"step": 1, "pad": "x" * 3000}) + "\n"
        with pytest.raises(workdir.NoSpace, match="no space left on device writing .*metrics"):
            for _ in range(1000):
                atomic.append(path, line)
        assert path.read_text().count("\n") == len(path.read_text()) // len(line)
        assert path.stat().st_size % len(line) == 0


def test_a_read_only_run_is_evaluated_with_output_and_never_trained(trained, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = mount("--bind", str(trained), str(ro)) and \
        (mount("-o", "remount,ro,bind", str(ro)) or subprocess.run(["umount", str(ro)]) and False)
    if not mounted:
        shutil.copytree(trained, ro, dirs_exist_ok=True)
        for p in [ro, *ro.rglob("*")]:
            p.chmod(p.stat().st_mode & ~0o222)
        if os.access(ro, os.W_OK):
            pytest.skip("neither a read-only mount nor a read-only directory can be made here")
    try:
        before = snapshot(ro)
        line = one_error_line(run(command(ro, 8, 2), 2).stderr)
        assert "read-only file system" in line or "not writable" in line, line
        assert "train.py writes checkpoints" in line and "eval.py --output=DIR" in line
        line = one_error_line(run(eval_command(ro), 2).stderr)
        assert "give --output=DIR" in line, line
        out = run(eval_command(ro, f"--output={tmp_path / 'out'}"), 0)
        results = json.loads((tmp_path / "out" / "results.json").read_text())
        assert results["step"] == 4 and "token perplexity" in out.stdout
        assert snapshot(ro) == before
    finally:
        if mounted:
            subprocess.run(["umount", str(ro)], check=True)


@pytest.mark.parametrize("code", ["ENOLCK", "ENOSYS", "EOPNOTSUPP"])
def test_a_filesystem_without_locks_is_one_line_and_the_workdir_stays_as_it_was(
        tmp_path, monkeypatch, code):
    """flock refused by the filesystem (NFS without its lock manager, Lustre without -o
    flock, FUSE: the kernel's answer is simulated here, the files are real): one line with
    the way out (--nolock), and neither the new workdir nor its lock file is left behind."""
    import errno
    import fcntl
    from switchzoo import workdir as workdir_lib

    def refuse(fd, how):
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))
    monkeypatch.setattr(fcntl, "flock", refuse)
    lock = workdir_lib.Lock(tmp_path / "new" / "run")
    with pytest.raises(workdir_lib.Refused, match=r"run: its filesystem does not support file "
                                                  r"locks \(flock: .*\).* add --nolock") as e:
        lock.take()
    assert "\n" not in str(e.value) and not (tmp_path / "new").exists()
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text("{}")
    with pytest.raises(workdir_lib.Refused):
        workdir_lib.Lock(tmp_path / "old").take()
    assert sorted(p.name for p in (tmp_path / "old").iterdir()) == ["config.json"]
    unlocked = workdir_lib.Lock(tmp_path / "old", enabled=False)     # --nolock
    unlocked.take()
    unlocked.release()
    assert sorted(p.name for p in (tmp_path / "old").iterdir()) == ["config.json"]
