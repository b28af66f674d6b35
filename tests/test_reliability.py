"""Preemption and crashes, as a scheduler delivers them: SIGTERM checkpoints the current step and
exits 0, and the resumed run is bitwise the uninterrupted one (every step's loss and the hash of
every batch consumed); SIGKILL at random moments, during asynchronous saves too, always resumes
from a committed checkpoint and leaves no temporary directories once the run finishes."""
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

from conftest import FAST_COMPILE

ROOT = pathlib.Path(__file__).resolve().parent.parent
# One CPU device (quick start-up per process); unbuffered, so a killed run's output survives.
ENV = {**os.environ, "XLA_FLAGS": FAST_COMPILE, "PYTHONUNBUFFERED": "1"}


def command(workdir, steps, every):
    return [sys.executable, "train.py", f"--config=configs/mini.py:model=switch_tiny,steps={steps}",
            "--config.log_every_steps=1", f"--config.checkpoint_every_steps={every}",
            "--config.eval_every_steps=0", "--config.per_device_batch_size=4",
            "--config.max_length=32", "--config.data.vocab_size=300",
            # 500 training pairs (a quicker tokenizer; the longer runs of tests/test_faults.py
            # repeat them), and 16 held-out texts for its eval.py runs (not ~1,000)
            "--config.data.embedded_max_pairs=500", "--config.data.max_eval_examples=16",
            f"--workdir={workdir}",
            # the shipped corpus alone (~2 s less per fresh run than reading this machine's
            # gettext catalogues, which add no pair here; every run reads the same pairs)
            f"--config.data.locale_dir={pathlib.Path(workdir).parent / 'no-catalogues'}"]


def steps_logged(workdir) -> dict:
    """{step: (loss, batch hash)} of every train row written so far (the last one wins)."""
    path = pathlib.Path(workdir) / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return {r["step"]: (r["loss"], r["batch_sha1"]) for r in rows if r["split"] == "train"}


def rows(workdir) -> int:
    path = pathlib.Path(workdir) / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


# Every wait is for something the run writes (a step logged, a checkpoint committed); this bound
# only keeps a broken run from hanging the suite, and is no measure of speed.
WAIT = 600


def start_and_wait(workdir, steps, every, until_step=None):
    """Starts a run; returns once it has logged ``until_step`` (default: one new step)."""
    seen = rows(workdir)
    proc = subprocess.Popen(command(workdir, steps, every), cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    give_up = time.monotonic() + WAIT
    while (max(steps_logged(workdir), default=0) < until_step if until_step
           else rows(workdir) <= seen):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < give_up, "the run hung before reaching the step"
        time.sleep(0.05)
    return proc


def run(workdir, steps, every):
    out = subprocess.run(command(workdir, steps, every), cwd=ROOT, env=ENV, capture_output=True,
                         text=True, timeout=WAIT)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def committed(workdir) -> set[int]:
    ckpts = pathlib.Path(workdir) / "checkpoints"
    return {int(p.name) for p in ckpts.iterdir() if p.name.isdigit()} if ckpts.exists() else set()


def test_sigterm_checkpoints_and_the_resumed_run_is_bitwise_the_uninterrupted_one(tmp_path):
    run(tmp_path / "straight", 12, 100)
    reference = steps_logged(tmp_path / "straight")
    proc = start_and_wait(tmp_path / "cut", 12, 100, until_step=4)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err[-2000:]
    stopped = max(steps_logged(tmp_path / "cut"))
    assert stopped < 12 and f"preempted: saved step {stopped}" in out
    assert committed(tmp_path / "cut") == {stopped}
    resumed = run(tmp_path / "cut", 12, 100)
    assert f"resuming at step {stopped}" in resumed.stdout
    assert steps_logged(tmp_path / "cut") == reference            # losses and batch hashes


def kill_at_a_random_moment(proc, workdir, rng, most=3):
    """SIGKILLs ``proc`` as soon as it has logged a random 1..``most`` more steps: a step's row
    is written just before its checkpoint starts (saves run every step), so kills land
    mid-save, at moments chosen by the run's own progress, not by a clock; each sitting ends
    a few steps after it started, far from the run's last step, however loaded the machine."""
    target, give_up = rows(workdir) + rng.randint(1, most), time.monotonic() + WAIT
    while (rows(workdir) < target or not committed(workdir)) and proc.poll() is None:
        assert time.monotonic() < give_up, "the run hung"
        time.sleep(0.005)
    proc.kill()
    proc.wait()


def test_sigkill_at_random_moments_resumes_from_committed_checkpoints(tmp_path):
    # 16 steps: the two killed sittings log at most ~5 steps each (a few here); the final
    # sitting runs the rest, saving every step as the killed ones did (the same command).
    rng = random.Random(0)
    workdir = tmp_path / "run"
    resumed_from = []
    proc = start_and_wait(workdir, 16, 1)
    for kill in range(2):
        kill_at_a_random_moment(proc, workdir, rng)
        before = committed(workdir)
        assert before, "at least one checkpoint should have committed"
        if kill == 1:               # the last kill: the final sitting resumes and finishes
            break
        proc = start_and_wait(workdir, 16, 1)
        # It resumed from the newest checkpoint that had committed, not from a partial one.
        said = proc.stdout.readline()               # data: ..., then model ...: resuming
        said += proc.stdout.readline()
        assert f"resuming at step {max(before)}" in said, said
        resumed_from.append(max(before))
    final = run(workdir, 16, 1)
    assert f"resuming at step {max(before)}" in final.stdout
    resumed_from.append(max(before))
    assert not [p for p in (workdir / "checkpoints").iterdir() if not p.name.isdigit()]
    assert max(committed(workdir)) == 16 and len(resumed_from) == 2


def test_a_diverging_run_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    import jax
    import numpy as np
    import pytest
    from switchzoo.configs import mini
    from switchzoo import evaluate, loop, state

    config = mini.get_config("model=switch_tiny,steps=4")
    config.log_every_steps, config.checkpoint_every_steps, config.eval_every_steps = 5, 2, 0
    config.per_device_batch_size, config.max_length = 1, 32
    config.data.vocab_size, config.data.embedded_max_pairs = 300, 500
    config.data.locale_dir = str(tmp_path / "no-catalogues")          # the shipped corpus alone
    loop.train(config, tmp_path, print_fn=lambda *_: None)          # good steps 1..4
    good = {p: p.stat().st_mtime_ns for p in (tmp_path / "checkpoints").rglob("*")}
    config.num_train_steps, config.learning_rate = 30, 1e9             # then a real blow-up
    config.allow_changes = True                 # a resumed run may change its rate when told so
    with pytest.raises(FloatingPointError, match=r"step (\d+): loss is .*cross entropy"
                                                 r".*last good checkpoint is kept") as info:
        loop.train(config, tmp_path, print_fn=lambda *_: None)
    bad = int(str(info.value).split()[1].rstrip(":"))
    assert max(committed(tmp_path)) < bad
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "checkpoints").rglob("*")
            if p in good} == good                                       # untouched
    _, params, step = evaluate.restore_params(config, tmp_path, state.run_layout(config), 300)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))
