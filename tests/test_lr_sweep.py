"""experiments/lr_sweep.py's bookkeeping (the runs themselves are the study): the grid's runs
and their baselines, the constant-schedule runs at each model's best rate, the best rate read
from finished runs with a flag where it lies at an end of the grid, and one-line refusals."""
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import lr_sweep  # noqa: E402


def test_grid_and_constant_schedule_runs():
    runs = {r.name: r for r in lr_sweep.runs((0.01, 0.02), 2400, {"dense": 0.02,
                                                                   "switch_8": 0.01})}
    assert list(runs)[:4] == ["dense_lr0.01", "switch_8_lr0.01", "dense_lr0.02", "switch_8_lr0.02"]
    assert runs["switch_8_lr0.02"].baseline == "dense_lr0.02"
    assert runs["switch_8_lr0.02"].flags == ("--config.learning_rate=0.02",)
    assert runs["dense_lr0.02_const"].flags == ("--config.learning_rate=0.02",
                                                "--config.warmup_steps=2400")
    assert runs["switch_8_lr0.01_const"].baseline == "dense_lr0.02_const"
    assert len(lr_sweep.runs((0.01, 0.02), 2400)) == 4        # no best yet: the grid alone


def test_best_rate_and_its_edge_flag():
    def result(losses, going=()):
        return {"runs": {n: {"eval_loss": [9.0, v], "finished": n not in going}
                         for n, v in losses.items()}}
    rates = (0.005, 0.01, 0.02)
    best = lr_sweep.best_rates(result({"dense_lr0.005": 5.0, "dense_lr0.01": 4.8,
                                       "dense_lr0.02": 4.9, "switch_8_lr0.005": 5.0,
                                       "switch_8_lr0.01": 4.9, "switch_8_lr0.02": 4.7}), rates)
    assert best["dense"]["rate"] == 0.01 and not best["dense"]["at_edge"]
    assert best["switch_8"]["rate"] == 0.02 and best["switch_8"]["at_edge"]
    # A run still training (its last evaluation lower than any finished run's) is not read.
    partial = lr_sweep.best_rates(result({"dense_lr0.02": 4.9, "dense_lr0.01": 4.0},
                                         going=("dense_lr0.01",)), rates)
    assert partial == {"dense": {"rate": 0.02, "loss": 4.9, "by_rate": {"0.02": 4.9},
                                 "at_edge": False,       # an unfinished grid flags nothing
                                 "rates_not_finished": [0.005, 0.01]}}
    assert lr_sweep.final(result({"dense_lr0.01": 4.0}, going=("dense_lr0.01",)),
                          "dense_lr0.01") is None


def test_refusals_in_one_line(tmp_path, capsys):
    (tmp_path / "train.txt").write_text("text\n")
    assert lr_sweep.main(["--out", str(tmp_path / "o"), "--corpus", str(tmp_path),
                          "--runs", "dense_lr0.3"]) == 2
    assert "not runs of this sweep" in capsys.readouterr().err
    assert lr_sweep.main(["--out", str(tmp_path / "o"), "--corpus", str(tmp_path),
                          "--rates", "0.01", "-1"]) == 2
    assert "must be a positive number" in capsys.readouterr().err
    assert lr_sweep.main(["--out", str(tmp_path / "o"), "--corpus", str(tmp_path / "none")]) == 2
    assert "no " in capsys.readouterr().err


def test_every_grid_and_constant_schedule_run_can_be_named():
    got = lr_sweep.names((0.01, 0.04))
    assert got == {"dense_lr0.01", "dense_lr0.04", "switch_8_lr0.01", "switch_8_lr0.04",
                   "dense_lr0.01_const", "dense_lr0.04_const", "switch_8_lr0.01_const",
                   "switch_8_lr0.04_const"}
