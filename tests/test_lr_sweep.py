"""experiments/lr_sweep.py's bookkeeping (the runs themselves are the study): the grid's runs
and their baselines, the constant-schedule runs at each model's best rate, the best rate read
from finished runs with a flag where it lies at an end of the grid, and one-line refusals."""
import pathlib
import sys

import pytest

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
    # a nameable run that no best rate trains (no grid run has finished here) is refused, not
    # passed over in silence
    assert lr_sweep.main(["--out", str(tmp_path / "o"), "--corpus", str(tmp_path),
                          "--runs", "dense_wide_lr0.01"]) == 2
    assert "puts at: none yet" in capsys.readouterr().err
    assert not (tmp_path / "o" / "dense_wide_lr0.01").exists()


def test_every_grid_constant_schedule_and_best_rate_run_can_be_named():
    got = lr_sweep.names((0.01, 0.04))
    assert {"dense_lr0.01", "dense_lr0.04", "switch_8_lr0.01", "switch_8_lr0.04",
            "dense_lr0.01_const", "dense_lr0.04_const", "switch_8_lr0.01_const",
            "switch_8_lr0.04_const", "dense_lr0.04_s1", "switch_32_lr0.01_s1"} <= got
    assert "switch_16_lr0.04_const" not in got and "dense_lr0.02_s1" not in got


def test_the_headline_questions_at_each_models_best_rate():
    """The second seed of the pair and Figure 4's rungs run at the best rates (the rungs at
    Switch-8's), each against dense of its own seed; and lm_claims' goals read them under its
    run names."""
    runs = {r.name: r for r in lr_sweep.runs((0.02, 0.04), 2400, {"dense": 0.04,
                                                                   "switch_8": 0.02})}
    assert runs["dense_lr0.04_s1"].seed == 1 and runs["dense_lr0.04_s1"].baseline is None
    assert runs["switch_8_lr0.02_s1"].baseline == "dense_lr0.04_s1"
    for seed, tail in ((0, ""), (1, "_s1")):
        rung = runs["switch_32_lr0.02" + tail]
        assert (rung.model, rung.seed, rung.baseline) == ("switch_lm_cpu_32", seed,
                                                          "dense_lr0.04" + tail)
        assert rung.flags == ("--config.learning_rate=0.02",)
    assert "switch_16_lr0.04" not in runs and "switch_8_lr0.02" in runs

    def run(model, losses, seed=0, rate=0.04, fraction=None):
        return {"model": model, "flags": [f"--config.learning_rate={rate:g}"], "seed": seed,
                "train_steps": 400, "starts_from": None, "finished": True,
                "steps": [200, 400], "eval_loss": losses, "final_eval_loss": losses[-1],
                "fraction_of_baseline_steps": fraction}
    result = {"runs": {
        "dense_lr0.04": run("dense_lm_cpu", [5.0, 4.0]),
        "dense_lr0.04_s1": run("dense_lm_cpu", [5.0, 4.1], seed=1),
        # recorded against dense at 0.02 (the grid's baseline): read again against dense at 0.04
        "switch_8_lr0.02": run("switch_lm_cpu_8", [4.5, 3.9], rate=0.02, fraction=0.1),
        "switch_8_lr0.02_s1": run("switch_lm_cpu_8", [4.6, 3.95], 1, 0.02, fraction=0.1),
        "switch_16_lr0.02": run("switch_lm_cpu_16", [4.4, 3.8], rate=0.02),
        "switch_8_lr0.04": run("switch_lm_cpu_8", [9.0, 9.0]),      # not at its best rate
        "switch_32_lr0.02": {**run("switch_lm_cpu_32", [4.4, 3.7]), "finished": False}}}
    best = {"dense": {"rate": 0.04}, "switch_8": {"rate": 0.02}}
    claims = lr_sweep.at_best_claims(result, best)
    assert claims["runs"] == {"dense": "dense_lr0.04", "dense_s1": "dense_lr0.04_s1",
                              "switch_8": "switch_8_lr0.02", "switch_8_s1": "switch_8_lr0.02_s1",
                              "switch_16": "switch_16_lr0.02"}
    speedup = claims["switch_8_speedup"]
    # dense's 4.0 reached at 200 + 0.5 / 0.6 x 200 (0.917 of 400); seed 1's 4.1 at 0.885
    assert speedup["fraction_of_dense_steps"] == [0.917, 0.885] and not speedup["holds"]
    # gaps 0.1 and 0.15, paired by seed: margin 0.125, within a paired t's 0.318 at 1 df
    noise = claims["switch_8_beyond_noise"]
    assert noise["gaps"] == [0.1, 0.15] and noise["noise_from"] == "paired"
    assert noise["noise"] == 0.3177 and noise["holds"] is False
    assert "more_experts_help" in claims and claims["more_experts_help"]["holds"]


def test_table1_rows_at_switch_8s_best_rate():
    """Switch Table 1's rows train at Switch-8's best rate on both seeds (seed 0 of every row
    first), each against dense of its own seed; their orderings are read like for like."""
    order = [r.name for r in lr_sweep.runs((0.02, 0.04), 2400, {"dense": 0.04,
                                                                 "switch_8": 0.02})]
    rows = [n for n in order if n.startswith(("top2", "switch_8_cf"))]
    assert rows[:5] == ["top2_8_lr0.02", "switch_8_cf1.0_lr0.02", "top2_8_cf1.0_lr0.02",
                        "switch_8_cf2.0_lr0.02", "top2_8_cf2.0_lr0.02"]
    assert rows[5:] == [n + "_s1" for n in rows[:5]]
    runs = {r.name: r for r in lr_sweep.runs((0.02, 0.04), 2400, {"dense": 0.04,
                                                                   "switch_8": 0.02})}
    top2 = runs["top2_8_cf2.0_lr0.02_s1"]
    assert (top2.model, top2.seed, top2.baseline) == ("switch_lm_cpu_8", 1, "dense_lr0.04_s1")
    assert top2.flags == ("--config.learning_rate=0.02", "--config.moe.top_k=2",
                          "--config.moe.train_capacity_factor=2.0")
    assert {"top2_8_lr0.04_s1", "switch_8_cf1.0_lr0.02"} <= lr_sweep.names((0.02, 0.04))

    def run(flags, loss, seed):
        return {"model": "switch_lm_cpu_8" if flags else "dense_lm_cpu",
                "flags": ["--config.learning_rate=0.04", *flags], "seed": seed,
                "train_steps": 400, "starts_from": None, "finished": True, "steps": [200, 400],
                "eval_loss": [9.0, loss], "final_eval_loss": loss,
                "fraction_of_baseline_steps": None}
    moe = ["--config.moe.top_k=2"]
    result = {"runs": {"dense_lr0.04": run([], 4.0, 0), "dense_lr0.04_s1": run([], 4.1, 1),
                       "switch_8_lr0.04": run(["x"], 3.9, 0),
                       "switch_8_lr0.04_s1": run(["x"], 4.0, 1),
                       "top2_8_lr0.04": run(["x", *moe], 3.92, 0),
                       "top2_8_lr0.04_s1": run(["x", *moe], 3.99, 1)}}
    claims = lr_sweep.at_best_claims(result, {"dense": {"rate": 0.04},
                                              "switch_8": {"rate": 0.04}})
    assert claims["runs"]["top2_8_s1"] == "top2_8_lr0.04_s1"
    pair = claims["top1_beats_top2"]["by_capacity"]["1.25"]   # gaps +0.02 and -0.01
    assert pair["seeds"] == [0, 1] and pair["gaps"] == [0.02, -0.01]
    assert pair["noise_from"] == "paired" and not pair["beyond_noise"]
    every = claims["switch_beats_dense_every_capacity"]
    # both rows 0.1 below dense on seed 0 and 0.1 / 0.11 on seed 1: top2_8's gaps (0.08,
    # 0.11) are too far apart for two seeds to call its margin beyond noise
    assert set(every["by_row"]) == {"switch_8", "top2_8"}
    assert every["by_row"]["switch_8"]["beyond_noise"] and every["holds"] is False


def test_the_pair_continued_to_twice_the_budget():
    """dense and Switch-8 at their best rates continue to twice the steps on both seeds
    (lm_claims' dense_long and switch_8_long), each Switch run against the continued dense of
    its seed; the fraction is read at every budget and the gap paired by seed."""
    runs = {r.name: r for r in lr_sweep.runs((0.02, 0.04), 2400, {"dense": 0.04,
                                                                   "switch_8": 0.02})}
    sw = runs["switch_8_lr0.02_long"]
    assert (sw.steps, sw.baseline, sw.flags) == (4800, "dense_lr0.04_long",
                                                 ("--config.learning_rate=0.02",))
    s1 = runs["switch_8_lr0.02_long_s1"]
    assert (s1.seed, s1.steps, s1.baseline) == (1, 4800, "dense_lr0.04_long_s1")
    assert runs["dense_lr0.04_long"].before is not None
    # the pair alone has a third seed (its fraction straddled the goal), continued like the rest
    s2 = runs["switch_8_lr0.02_long_s2"]
    assert (s2.seed, s2.steps, s2.baseline) == (2, 4800, "dense_lr0.04_long_s2")
    assert runs["dense_lr0.04_s2"].seed == 2 and "switch_16_lr0.02_s2" not in runs
    assert {"switch_8_lr0.04_long", "dense_lr0.04_long_s1", "dense_lr0.04_long_s2",
            "switch_8_lr0.04_s2"} <= lr_sweep.names((0.04,))
    assert "top2_8_lr0.04_s2" not in lr_sweep.names((0.04,))

    def run(model, losses, steps=(200, 400), seed=0):
        return {"model": model, "flags": [], "seed": seed, "train_steps": steps[-1],
                "starts_from": None, "finished": True, "steps": list(steps),
                "eval_loss": losses, "final_eval_loss": losses[-1],
                "fraction_of_baseline_steps": None}
    four = (200, 400, 600, 800)
    result = {"runs": {"dense_lr0.04": run("dense_lm_cpu", [5.0, 4.0]),
                       "switch_8_lr0.04": run("switch_lm_cpu_8", [4.5, 3.9]),
                       "dense_lr0.04_long": run("dense_lm_cpu", [5.0, 4.0, 3.6, 3.5], four),
                       "switch_8_lr0.04_long": run("switch_lm_cpu_8", [4.5, 3.9, 3.5, 3.4],
                                                   four),
                       "dense_lr0.04_long_s1": run("dense_lm_cpu", [5.0, 4.0, 3.6, 3.6], four,
                                                   1),
                       "switch_8_lr0.04_long_s1": run("switch_lm_cpu_8", [4.5, 3.9, 3.5, 3.45],
                                                      four, 1),
                       "dense_lr0.04_long_s2": run("dense_lm_cpu", [5.0, 4.0, 3.6, 3.5], four,
                                                   2),
                       "switch_8_lr0.04_long_s2": run("switch_lm_cpu_8", [4.5, 3.6, 3.4, 3.3],
                                                      four, 2)}}
    claims = lr_sweep.at_best_claims(result, {"dense": {"rate": 0.04},
                                              "switch_8": {"rate": 0.04}})
    long = claims["switch_8_speedup_long"]
    # seed 0: dense's 3.5 reached at step 600 of 800; seed 1: its 3.6 at 550 of 800; seed 2:
    # its 3.5 at 400 + 0.1/0.2 x 200 = 500 of 800
    assert long["fraction_of_dense_steps"] == [0.75, 0.688, 0.625]
    assert long["gap"] == [0.1, 0.15, 0.2]
    # dense's 5.0 at 200 is reached by the first evaluation (1.0); its 4.0 at 400 at
    # 200 + 0.5/0.6 x 200 = 366.7; 3.6 at 600 at 400 + 0.3/0.4 x 200 = 550; 3.5 at 800 at 600
    assert long["by_budget"]["switch_8_long"] == [[200, 1.0], [400, 0.917], [600, 0.917],
                                                  [800, 0.75]]
    assert long["beyond_noise"]["gaps"] == [0.1, 0.15, 0.2] and not long["holds"]
    assert claims["runs"]["switch_8_long_s2"] == "switch_8_lr0.04_long_s2"


def test_the_speedup_by_budget_is_drawn(tmp_path):
    import plots
    path = tmp_path / "speedup.png"
    plots.plot_fractions({"switch_8 vs dense": [[200, 1.0], [400, None], [600, 0.8]]}, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_dense_upper_bound_at_denses_best_rate_on_two_seeds():
    """dense_wide (Switch-8's parameters as dense FFNs) trains at dense's best rate on both
    seeds, and lm_claims' upper-bound question reads it like for like by seed."""
    runs = {r.name: r for r in lr_sweep.runs((0.02, 0.04), 2400, {"dense": 0.04,
                                                                   "switch_8": 0.02})}
    for seed, tail in ((0, ""), (1, "_s1")):
        wide = runs["dense_wide_lr0.04" + tail]
        assert (wide.model, wide.seed, wide.baseline, wide.flags) == (
            "dense_lm_cpu_wide", seed, "dense_lr0.04" + tail, ("--config.learning_rate=0.04",))
    assert "dense_wide_lr0.04_s1" in lr_sweep.names((0.04,))
    bracket = runs["dense_wide_lr0.02"]           # its own best rate: the grid's neighbours
    assert (bracket.seed, bracket.baseline) == (0, "dense_lr0.04")
    assert "dense_wide_lr0.02_s1" not in runs

    def run(model, loss, seed, rate):
        return {"model": model, "flags": [f"--config.learning_rate={rate:g}"], "seed": seed,
                "train_steps": 400, "starts_from": None, "finished": True, "steps": [200, 400],
                "eval_loss": [9.0, loss], "final_eval_loss": loss,
                "fraction_of_baseline_steps": None}
    result = {"runs": {"dense_lr0.04": run("dense_lm_cpu", 4.0, 0, 0.04),
                       "dense_lr0.04_s1": run("dense_lm_cpu", 4.1, 1, 0.04),
                       "switch_8_lr0.02": run("switch_lm_cpu_8", 3.9, 0, 0.02),
                       "switch_8_lr0.02_s1": run("switch_lm_cpu_8", 4.0, 1, 0.02),
                       "dense_wide_lr0.04": run("dense_lm_cpu_wide", 3.85, 0, 0.04),
                       "dense_wide_lr0.04_s1": run("dense_lm_cpu_wide", 3.97, 1, 0.04)}}
    claims = lr_sweep.at_best_claims(result, {"dense": {"rate": 0.04},
                                              "switch_8": {"rate": 0.02}})
    assert claims["runs"]["dense_wide_s1"] == "dense_wide_lr0.04_s1"
    bound = claims["dense_upper_bound"]
    assert bound["dense_wide_minus_switch_8"] == pytest.approx(-0.05)
    c = bound["against_dense_wide"]["switch_8"]       # Switch behind by 0.05 and 0.03
    assert c["seeds"] == [0, 1] and c["gaps"] == [-0.05, -0.03] and not c["better"]


def test_dense_wide_at_the_rates_either_side_of_denses_best():
    """dense_wide borrows dense's best rate; the bracket (seed 0, the grid's neighbours of that
    rate) says whether the borrowed rate is its own best."""
    rates = (0.005, 0.01, 0.02, 0.04, 0.08)
    got = {r.name for r in lr_sweep.runs(rates, 2400, {"dense": 0.04, "switch_8": 0.04})}
    assert {"dense_wide_lr0.02", "dense_wide_lr0.08"} <= got
    assert "dense_wide_lr0.01" not in got and "dense_wide_lr0.08_s1" not in got
    edge = {r.name for r in lr_sweep.runs(rates, 2400, {"dense": 0.08, "switch_8": 0.04})}
    assert "dense_wide_lr0.04" in edge and "dense_wide_lr0.16" not in edge   # one neighbour

    def result(losses, going=()):
        return {"runs": {n: {"eval_loss": [9.0, v], "finished": n not in going}
                         for n, v in losses.items()}}
    best = {"dense": {"rate": 0.04}}
    own = lr_sweep.wide_rates(result({"dense_wide_lr0.02": 4.10, "dense_wide_lr0.04": 4.06,
                                      "dense_wide_lr0.08": 4.08}), rates, best)["dense_wide"]
    assert own["by_rate"] == {"0.02": 4.10, "0.04": 4.06, "0.08": 4.08}
    assert own["borrowed_rate_is_best"] and not own["at_edge"]
    lower = lr_sweep.wide_rates(result({"dense_wide_lr0.02": 4.00, "dense_wide_lr0.04": 4.06,
                                        "dense_wide_lr0.08": 4.2}), rates, best)["dense_wide"]
    assert lower["best_rate"] == 0.02 and not lower["borrowed_rate_is_best"] and lower["at_edge"]
    # a bracket run still training is not read; one rate alone answers nothing
    assert lr_sweep.wide_rates(result({"dense_wide_lr0.02": 3.0, "dense_wide_lr0.04": 4.06},
                                      going=("dense_wide_lr0.02",)), rates, best) == {}
