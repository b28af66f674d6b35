"""The demo training loop: the loss falls and metrics.jsonl holds the DESIGN.md fields."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from configs import demo  # noqa: F401  (configs/ is importable from the repository root)
from switchzoo import training

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_loss_falls_and_metrics_are_written(tmp_path):
    config = demo.get_config("num_train_steps=60,log_every_steps=20,max_length=64")
    config.per_device_batch_size = 2
    config.layout, config.mesh = "dp_ep", "data:2,model:1,expert:4"
    rows = training.train(config, str(tmp_path), print_fn=lambda *_: None)
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5, rows
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [20, 40, 60]
    for field in ("loss", "aux_loss", "z_loss", "dropped_fraction", "expert_load",
                  "tokens_per_sec"):
        assert field in lines[-1]
    assert len(lines[-1]["expert_load"]) == 2 and len(lines[-1]["expert_load"][0]) == 8


@pytest.mark.parametrize("flag, message", [
    ("--config.layout=data_paralel", "did you mean 'data_parallel'"),
    ("--config.layoutt=dp_ep", 'Did you mean "layout" instead of "layoutt"'),
    ("--config.num_train_steps=many", "invalid literal for int()"),
    ("--config.model=switch_tinny", "did you mean 'switch_tiny'"),
    ("--config.mesh=data:3", "has 3 devices but 1 are available"),
    ("--config=configs/nope.py", "No such file or directory: 'configs/nope.py'"),
])
def test_train_py_rejects_bad_flags_in_one_line(tmp_path, flag, message):
    out = subprocess.run([sys.executable, "train.py", "--config=configs/demo.py", flag,
                          f"--workdir={tmp_path}"], capture_output=True, text=True, cwd=ROOT,
                         timeout=120, env={**os.environ, "XLA_FLAGS": ""})
    assert out.returncode == 2
    assert message in out.stderr and out.stderr.strip().count("\n") == 0, out.stderr
    assert not any(tmp_path.iterdir()), "a failed start must not write into the workdir"
