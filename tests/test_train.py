"""The demo training loop: the loss falls and metrics.jsonl holds the DESIGN.md fields."""
import json
import pathlib
import subprocess
import sys

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


def test_train_py_rejects_an_unknown_layout_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "train.py", "--config=configs/demo.py",
                          "--config.layout=data_paralel", f"--workdir={tmp_path}"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode != 0
    assert "did you mean 'data_parallel'" in out.stderr and "Traceback" not in out.stderr
