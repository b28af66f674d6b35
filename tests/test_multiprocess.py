"""JAX's own multi-process runtime: 2 processes x 4 CPU devices (jax.distributed.initialize on
loopback, gloo collectives), each reading only its rows of every batch, train like 1 process x
8 devices; both stop on Ctrl-C at one agreed step and resume as if uninterrupted; their
checkpoint resumes in one process;
evaluation split over the two gives one process's BLEU and perplexity; bad starts fail on every
process in one line."""
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np

from conftest import FAST_COMPILE

ROOT = pathlib.Path(__file__).resolve().parent.parent
MESH = "--config.mesh=data:2,model:1,expert:4"


def args(workdir, steps, layout="dp_ep"):
    return [sys.executable, "train.py", f"--config=configs/mini.py:model=switch_base_tiny,task=translation,steps={steps}",
            "--config.log_every_steps=1", "--config.checkpoint_every_steps=2",
            "--config.eval_every_steps=0", "--config.per_device_batch_size=2",
            # eval_args' set (its examples, and how many it decodes): the run's own results.json
            "--config.data.max_eval_examples=40", "--config.eval.max_examples=12",
            "--config.learning_rate=3e-5",       # barely trained: its outputs are not all EOS
            # T5's init, not the Switch catalogue's 0.1: the latter's near-uniform first steps
            # decode EOS first, and empty translations would compare equal whatever ran
            "--config.init_scale=1.0", "--config.init_distribution=normal",
            "--config.max_length=32", "--config.data.vocab_size=300",
            "--config.data.embedded_max_pairs=500", "--config.data.pair=en-de", f"--config.layout={layout}", MESH,
            # the shipped corpus alone: every run reads the same pairs on any machine, and none
            # spends ~2 s reading this machine's gettext catalogues (here they add no pair)
            f"--config.data.locale_dir={pathlib.Path(workdir).parent / 'no-catalogues'}",
            f"--workdir={workdir}"]


def eval_args(workdir):
    return [sys.executable, "eval.py", f"--workdir={workdir}", "--config.eval.max_examples=12",
            "--config.data.max_eval_examples=40", "--config.eval.max_decode_length=6",
            "--config.eval.num_beams=2"]


def env(devices):
    return {**os.environ,
            "XLA_FLAGS": f"{FAST_COMPILE} --xla_force_host_platform_device_count={devices}",
            "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Runs the script in argv[1] with SIGINT at its default disposition (a shell's background job
# inherits it ignored, and a process started there would never see Ctrl-C).
DEFAULT_SIGINT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                  "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


def two(command, extra=(), timeout=300, ctrl_c_after=None):
    """Runs ``command`` as processes 0 and 1 of a 2-process run; [(returncode, out, err)].
    ``ctrl_c_after``: once the run has logged that many steps, SIGINT to both processes, as a
    terminal's Ctrl-C sends it to its foreground processes."""
    port = free_port()
    if ctrl_c_after:    # as a terminal's foreground job: SIGINT at its default, even where this
        command = [sys.executable, "-c", DEFAULT_SIGINT, *command[1:]]   # runs in background
    procs = [subprocess.Popen(command + [f"--coordinator_address=127.0.0.1:{port}",
                                         "--num_processes=2", f"--process_id={i}",
                                         *(extra[i] if extra else ())],
                              cwd=ROOT, env=env(4), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    if ctrl_c_after:
        metrics = pathlib.Path(next(f.split("=", 1)[1] for f in command
                                    if f.startswith("--workdir="))) / "metrics.jsonl"
        give_up = time.monotonic() + timeout          # only keeps a broken run from hanging
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= ctrl_c_after):
            assert all(p.poll() is None for p in procs) and time.monotonic() < give_up
            time.sleep(0.05)
        for p in procs:
            p.send_signal(signal.SIGINT)
    out = [(p, *p.communicate(timeout=timeout)) for p in procs]
    return [(p.returncode, o, e) for p, o, e in out]


def here(command):
    """A 1-process train.py ``command`` run in this process (8 simulated devices, the same XLA
    flags as ``env(8)``): the same program without a process start."""
    from switchzoo import loop
    from switchzoo.configs import base, mini
    config = mini.get_config(command[2].split(":", 1)[1])
    for flag in command[3:]:
        if flag.startswith("--config."):
            key, _, value = flag[len("--config."):].partition("=")
            base.set_field(config, key, value)
    workdir = next(f.split("=", 1)[1] for f in command if f.startswith("--workdir="))
    loop.train(config, workdir, print_fn=lambda *_: None)


def evaluate_here(command):
    """A 1-process eval.py ``command`` run in this process, as eval.py runs it: the run's saved
    config with the command's --config.FIELD=value overrides."""
    from switchzoo import evaluate
    workdir = pathlib.Path(next(f.split("=", 1)[1] for f in command
                                if f.startswith("--workdir=")))
    overrides = dict(f[len("--config."):].split("=", 1) for f in command
                     if f.startswith("--config."))
    evaluate.run(evaluate.load_config(workdir, overrides), workdir, print_fn=lambda *_: None)


def ok(results):
    for code, _, err in results:
        assert code == 0, err[-2000:]
    return results


def rows(workdir):
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if r["split"] == "train"}


def test_two_processes_train_resume_and_evaluate_like_one(tmp_path):
    """One test, not several on a shared fixture: pytest-xdist's worksteal may hand tests of one
    module to both workers, and each would then repeat these runs (~80 s)."""
    # two: 2 processes of 8 steps, stopped by Ctrl-C after step 3 (both save one agreed step,
    # exit 0), then resumed to the end; moved: that checkpoint resumed in one process; single:
    # 1 process, 8 steps uninterrupted.
    started = ok(two(args(tmp_path / "two", 8), ctrl_c_after=3))
    stopped = max(rows(tmp_path / "two"))
    assert 3 <= stopped < 8
    assert stopped in {int(p.name) for p in (tmp_path / "two" / "checkpoints").iterdir()}
    assert f"preempted: saved step {stopped}" in started[0][1]
    for _, _, err in started:
        assert "interrupted: saving this step" in err
    shutil.copytree(tmp_path / "two", tmp_path / "moved")
    resumed = ok(two(args(tmp_path / "two", 8)))
    here(args(tmp_path / "moved", 8))
    here(args(tmp_path / "single", 8))

    # Each process names its split, reads disjoint rows, and together they read 1's batch.
    for i, (_, out, _) in enumerate(started):
        assert re.search(rf"^input: process {i}/2 reads rows {8 * i}..{8 * i + 7} of each "
                         rf"global batch \([\d,]+ examples, 8 per step; batch shards "
                         rf"{4 * i}..{4 * i + 3} of 8\)$", out, re.M), out[-1000:]
    two_rows, single = rows(tmp_path / "two"), rows(tmp_path / "single")
    assert sorted(two_rows) == sorted(single) == list(range(1, 9))
    assert f"resuming at step {stopped}" in resumed[0][1]
    for step, r in single.items():          # after the Ctrl-C too: resumed = uninterrupted
        t = two_rows[step]
        assert t["shard_process"] == [0] * 4 + [1] * 4           # who read which shard
        ours = [set(t["shard_sha1"][:4]), set(t["shard_sha1"][4:])]
        assert not ours[0] & ours[1]                              # disjoint rows ...
        assert t["shard_sha1"] == r["shard_sha1"]                 # ... whose union is 1's
        assert t["batch_sha1"] == r["batch_sha1"]
        np.testing.assert_allclose(t["loss"], r["loss"], rtol=1e-5)

    # The 2-process checkpoint resumes in one process as if uninterrupted.
    moved = rows(tmp_path / "moved")
    assert sorted(moved) == list(range(1, 9))
    for step in range(stopped + 1, 9):
        assert moved[step]["batch_sha1"] == single[step]["batch_sha1"]
        np.testing.assert_allclose(moved[step]["loss"], single[step]["loss"], rtol=1e-5)

    # Evaluation spread over two processes = one process: BLEU, perplexity, every hypothesis.
    results = ok(two(eval_args(tmp_path / "two")))
    spread = json.loads((tmp_path / "two" / "results.json").read_text())
    assert "BLEU" in results[0][1] and "BLEU" not in results[1][1]     # process 0 reports
    outputs = (tmp_path / "two" / "translations.txt").read_text()
    evaluate_here(eval_args(tmp_path / "two"))
    alone = json.loads((tmp_path / "two" / "results.json").read_text())
    assert spread["bleu"] is not None
    for key in ("bleu", "neg_log_perplexity", "token_perplexity", "accuracy"):
        np.testing.assert_allclose(spread[key], alone[key], rtol=1e-5, err_msg=key)
    assert (tmp_path / "two" / "translations.txt").read_text() == outputs
    assert len(outputs.splitlines()) == 12 and len(set(outputs.splitlines())) > 1


def test_bad_starts_fail_on_every_process_in_one_line(tmp_path):
    cases = [
        ("configs", [["--config.seed=1"], ["--config.seed=2"]], "dp_ep", "different configs"),
        ("rows", None, "batch:expert+data,experts:expert", "not one contiguous run"),
    ]
    for name, extra, layout, message in cases:
        for code, out, err in two(args(tmp_path / name, 2, layout), extra):
            lines = err.strip().splitlines()
            assert code == 2, (name, err[-2000:])
            assert lines[-1].startswith("error: process ") and message in lines[-1], name
        assert not (tmp_path / name).exists()                     # nothing written
    alone = subprocess.run(args(tmp_path / "c", 2) + [
        f"--coordinator_address=127.0.0.1:{free_port()}", "--num_processes=2",
        "--process_id=1", "--coordinator_timeout=2"], cwd=ROOT, env=env(4), capture_output=True,
        text=True, timeout=120)
    assert alone.returncode == 2
    assert alone.stderr.strip().splitlines()[-1].startswith(
        "error: process 1/2: no coordinator answers at 127.0.0.1:")
    assert not (tmp_path / "c").exists()
