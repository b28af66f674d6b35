"""JAX's own multi-process runtime: 2 processes x 4 CPU devices (jax.distributed.initialize on
loopback, gloo collectives) train like 1 process x 8 devices, and their checkpoint resumes in a
single process."""
import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np

from conftest import FAST_COMPILE

ROOT = pathlib.Path(__file__).resolve().parent.parent


def args(workdir, steps):
    return [sys.executable, "train.py", f"--config=configs/mini.py:model=switch_tiny,steps={steps}",
            "--config.log_every_steps=1", "--config.checkpoint_every_steps=3",
            "--config.eval_every_steps=0", "--config.per_device_batch_size=2",
            "--config.max_length=32", "--config.data.vocab_size=300",
            "--config.data.embedded_max_pairs=2000", "--config.layout=dp_ep",
            "--config.mesh=data:2,model:1,expert:4", f"--workdir={workdir}"]


def env(devices):
    return {**os.environ,
            "XLA_FLAGS": f"{FAST_COMPILE} --xla_force_host_platform_device_count={devices}",
            "PYTHONUNBUFFERED": "1"}


def losses(workdir):
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: (r["loss"], r["batch_sha1"]) for r in rows if r["split"] == "train"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_train_like_one_and_their_checkpoint_resumes_in_one(tmp_path):
    port = free_port()
    procs = [subprocess.Popen(args(tmp_path / "two", 6) + [
        f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"],
        cwd=ROOT, env=env(4), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    one = subprocess.run(args(tmp_path / "one", 6), cwd=ROOT, env=env(8), capture_output=True,
                         text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    two, single = losses(tmp_path / "two"), losses(tmp_path / "one")
    assert sorted(two) == sorted(single) == list(range(1, 7))
    for step in single:
        assert two[step][1] == single[step][1]                   # the same batches
        np.testing.assert_allclose(two[step][0], single[step][0], rtol=1e-5)
    resumed = subprocess.run(args(tmp_path / "two", 9), cwd=ROOT, env=env(8),
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming at step 6" in resumed.stdout
    assert sorted(losses(tmp_path / "two")) == list(range(1, 10))
