"""experiments/span_claims.py's bookkeeping and experiments/span_effects.py's readers (the runs
themselves are the study): each router change, each learning rate and each one-stack Switch model
judged against switch_8 and dense of its rate and seed under the noise rule."""
import pathlib
import sys

import pytest

from test_study_arithmetic import summary   # a run's summary as harness.collect gives it

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "experiments"))

import harness  # noqa: E402
import span_claims  # noqa: E402
import span_effects  # noqa: E402
import span_runs  # noqa: E402

LONG = [2000, 12000]         # the evaluations of the long pair's variants in these tests
# dense and no-jitter Switch-8 at 0.04 at LONG, by seed: the pair each long variant is read by
PAIR = {0: ([3.3, 2.72], [3.37, 2.84]), 1: ([3.46, 2.69], [3.42, 2.82])}


def beside_the_pair(variant, losses: dict) -> dict:
    """Run summaries of dense and Switch-8 at 0.04 (PAIR) and of ``variant(seed)`` at
    ``losses[seed]``, for each seed of ``losses``, all evaluated at LONG."""
    runs = {}
    for seed, mine in losses.items():
        runs_of_seed = (*span_runs.rated(0.04, seed), variant(seed))
        for run, got in zip(runs_of_seed, (*PAIR[seed], mine)):
            runs[run.name] = summary(LONG, got, seed=seed, model=run.model, flags=run.flags)
    return runs


def test_span_router_effects_compare_each_change_with_switch_8_and_dense():
    steps = [1200, 2400]
    runs = {"dense": summary(steps, [4.0, 3.78], model="dense_sc_cpu", baseline="dense"),
            "dense_s1": summary(steps, [4.1, 3.90], seed=1, model="dense_sc_cpu",
                                baseline="dense_s1"),
            "switch_8": summary(steps, [4.1, 3.83], model="switch_sc_cpu_8", baseline="dense",
                                router_entropy_train=[1.84, 0.99]),
            "switch_8_zloss": summary(steps, [4.0, 3.70], model="switch_sc_cpu_8",
                                      flags=["--config.moe.z_loss_weight=0.001"],
                                      baseline="dense", router_entropy_train=[1.2, 0.9]),
            "switch_8_enc0": summary(steps, [4.2, 3.95], model="switch_sc_cpu_8_enc0",
                                     baseline="dense", finished=False)}
    out = span_effects.router_effects({"runs": runs})
    assert list(out) == ["switch_8_zloss"]                  # an unfinished run is left out
    z = out["switch_8_zloss"]
    assert z["change"] == "--config.moe.z_loss_weight=0.001"
    assert z["minus_switch_8"] == pytest.approx(-0.13) and z["minus_dense"] == pytest.approx(-0.08)
    # one seed: judged against the reference spread, dense's two seeds 0.12 apart
    assert z["against_dense"]["runs"] == ["switch_8_zloss", "dense"]
    assert z["against_dense"]["better"] is True
    assert z["router_entropy_train"] == [1.2, 0.9]
    assert z["switch_8_router_entropy_train"] == [1.84, 0.99]
    assert span_effects.router_effects({"runs": {"dense": runs["dense"]}}) == {}
    # without a model at two seeds there is no noise estimate, and the verdict says so
    alone = {k: v for k, v in runs.items() if k != "dense_s1"}
    e = span_effects.router_effects({"runs": alone})
    assert e["switch_8_zloss"]["against_dense"]["verdict"] == "better, no noise estimate"


def test_span_rate_effects_pair_no_jitter_switch_with_dense_of_its_rate_and_seed():
    steps = [1200, 2400]
    lr = lambda r: [f"--config.learning_rate={r:g}"]                          # noqa: E731
    nj = ["--config.moe.jitter=0"]
    runs = {"dense": summary(steps, [4.0, 3.8], model="d"),
            "switch_8_nojitter": summary(steps, [4.0, 3.7], model="s", flags=nj),
            "dense_lr0.04": summary(steps, [3.9, 3.6], model="d", flags=lr(0.04)),
            "dense_lr0.04_s1": summary(steps, [3.9, 3.65], 1, model="d", flags=lr(0.04)),
            "switch_8_nojitter_lr0.04": summary(steps, [3.8, 3.5], model="s",
                                                flags=lr(0.04) + nj),
            "switch_8_nojitter_lr0.04_s1": summary(steps, [3.8, 3.58], 1, model="s",
                                                   flags=lr(0.04) + nj),
            "dense_lr0.02": summary(steps, [3.9, 3.7], model="d", flags=lr(0.02)),
            "switch_8_nojitter_lr0.02": summary(steps, [3.9, 3.6], model="s",
                                                flags=lr(0.02) + nj, finished=False)}
    out = span_effects.rate_effects({"runs": runs})
    # 0.02's Switch run has not finished; each at its best: 0.04 for both (the only rate
    # either ran on two seeds)
    assert list(out) == ["0.01", "0.04", "each_at_its_best"]
    assert out["each_at_its_best"]["best_rate"] == {"dense": 0.04, "switch_8_nojitter": 0.04}
    at = out["0.04"]
    assert at["dense"] == {0: 3.6, 1: 3.65} and at["switch_8_nojitter"] == {0: 3.5, 1: 3.58}
    c = at["switch_better"]
    assert c["seeds"] == [0, 1] and c["gaps"] == [0.1, 0.07] and c["noise_from"] == "paired"
    # margin 0.085, within a paired t's 95% half-width at 1 df: 12.71 x 0.0212 / sqrt(2) = 0.19
    assert c["better"] and not c["beyond_noise"] and c["noise"] == 0.1906
    assert out["0.01"]["switch_better"]["noise_from"] == "reference"   # one seed each
    names = {r.name: r for r in span_runs.RATES}
    assert names["switch_8_nojitter_lr0.02_s1"].baseline == "dense_lr0.02_s1"
    assert names["switch_8_nojitter_lr0.02_s1"].flags == ("--config.learning_rate=0.02",
                                                          "--config.moe.jitter=0")
    # the long pair's fourth seed at each model's best rate can run by name
    assert names["switch_8_nojitter_lr0.08_s3"].baseline == "dense_lr0.08_s3"
    assert "dense_lr0.04_s3" in names


def test_span_stack_effects_judge_the_dense_encoder_switch_against_dense_and_switch_8():
    steps = [1200, 2400]
    lr = ["--config.learning_rate=0.04"]
    nj = ["--config.moe.jitter=0"]
    dec = "switch_8_dec_nojitter_lr0.04"
    runs = {"dense_lr0.04": summary(steps, [3.9, 3.60], model="d", flags=lr),
            "dense_lr0.04_s1": summary(steps, [3.9, 3.70], 1, model="d", flags=lr),
            "switch_8_nojitter_lr0.04": summary(steps, [3.8, 3.62], model="s", flags=lr + nj),
            dec: summary(steps, [3.8, 3.55], model="dec", flags=lr + nj,
                         router_entropy_train=[1.1]),
            dec + "_s1": summary(steps, [3.8, 3.60], 1, model="dec", flags=lr + nj),
            dec + "_s2": summary(steps, [3.8, 3.40], 2, model="dec", flags=lr + nj,
                                 finished=False)}
    out = span_effects.stack_effects({"runs": runs})
    assert list(out) == ["dec"]                       # the encoder-only model has not run
    out = out["dec"]
    assert out["final_eval_loss"] == {0: 3.55, 1: 3.6}        # seed 2 has not finished
    assert out["router_entropy_train"][dec] == [1.1]
    c = out["against_dense_lr0.04"]
    assert c["seeds"] == [0, 1] and c["gaps"] == [0.05, 0.1] and c["better"]
    # against Switch-8 one seed pairs (seed 0): the study's reference spread, dense's 0.1
    s = out["against_switch_8_nojitter_lr0.04"]
    assert s["seeds"] == [0] and s["noise_from"] == "reference" and s["better"]
    assert span_effects.stack_effects({"runs": {k: v for k, v in runs.items()
                                                 if not k.startswith(dec)}}) == {}
    # a study that ran seed 1 alone (the 12,000-step one) is judged on that seed
    del runs[dec]
    alone = span_effects.stack_effects({"runs": runs})["dec"]
    assert alone["final_eval_loss"] == {1: 3.6}
    assert alone["against_dense_lr0.04"]["seeds"] == [1]
    assert alone["against_dense_lr0.04"]["gaps"] == [pytest.approx(0.1)]
    names = {r.name: r for r in span_runs.ONE_STACK}
    assert names[dec + "_s2"].baseline == "dense_lr0.04_s2"
    assert names[dec].model == "switch_sc_cpu_8_dec"
    assert names["switch_8_enc_nojitter_lr0.04_s1"].model == "switch_sc_cpu_8_enc"


def test_a_router_changes_second_seed_is_read_against_switch_8_and_dense_of_its_seed():
    z = ["--config.moe.z_loss_weight=0.001"]
    steps = [1200, 2400]
    runs = {"dense": summary(steps, [4.0, 3.78], model="dense_sc_cpu", baseline="dense"),
            "dense_s1": summary(steps, [4.1, 3.90], seed=1, model="dense_sc_cpu",
                                baseline="dense_s1"),
            "switch_8": summary(steps, [4.1, 3.83], model="switch_sc_cpu_8", baseline="dense"),
            "switch_8_s1": summary(steps, [4.1, 3.95], seed=1, model="switch_sc_cpu_8",
                                   baseline="dense_s1"),
            "switch_8_zloss": summary(steps, [4.0, 3.70], model="switch_sc_cpu_8", flags=z,
                                      baseline="dense"),
            "switch_8_zloss_s1": summary(steps, [4.0, 3.85], seed=1, model="switch_sc_cpu_8",
                                         flags=z, baseline="dense_s1")}
    out = span_effects.router_effects({"runs": runs})
    s1 = out["switch_8_zloss_s1"]
    assert s1["minus_switch_8"] == pytest.approx(-0.10)
    assert s1["minus_dense"] == pytest.approx(-0.05)
    paired = out["switch_8_zloss"]["against_dense"]           # both seeds, like for like
    assert paired["seeds"] == [0, 1] and paired["gaps"] == [0.08, 0.05]
    assert paired["noise_from"] == "paired"
    second = {r.name: r for r in span_runs.ROUTER if r.seed == 1}
    assert set(second) == {"switch_8_nojitter_s1", "switch_8_zloss_s1",
                           "switch_8_router_lr10_s1", "switch_8_enc0_s1"}
    assert second["switch_8_enc0_s1"].model == "switch_sc_cpu_8_enc0"
    assert {r.baseline for r in second.values()} == {"dense_s1"}


def test_the_pair_at_four_times_the_batch_sees_the_same_tokens_on_the_same_schedule():
    assert [r.name for r in span_runs.batched(2)] == [
        "dense_lr0.04_b128_s2", "switch_8_nojitter_lr0.04_b128_s2"]
    assert {r.seed for r in span_runs.batched(2)} == {2}
    assert {r.baseline for r in span_runs.batched(2)} == {"dense_lr0.04_b128_s2"}
    assert len(span_runs.BATCHED) == 6                         # seeds 0, 1 and 2
    dense, switch = span_runs.batched(0)
    assert (dense.steps, switch.steps) == (600, 600)            # 2,400 steps of 32 -> 600 of 128
    assert "--config.per_device_batch_size=128" in switch.flags
    assert "--config.warmup_steps=62" in switch.flags and "--config.moe.jitter=0" in switch.flags
    assert switch.baseline == dense.name == "dense_lr0.04_b128"
    runs = {"dense_lr0.04": summary([1200, 2400], [3.5, 3.23], model="dense_sc_cpu",
                                    flags=["--config.learning_rate=0.04"]),
            "switch_8_nojitter_lr0.04": summary([1200, 2400], [3.5, 3.28], model="switch_sc_cpu_8",
                                                flags=["x"]),
            dense.name: summary([200, 600], [4.0, 3.40], model="dense_sc_cpu", flags=dense.flags),
            switch.name: summary([200, 600], [4.0, 3.35], model="switch_sc_cpu_8",
                                 flags=switch.flags, finished=False)}
    assert span_effects.batch_effects({"runs": runs}) == {}        # the pair has not finished
    runs[switch.name]["finished"] = True
    out = span_effects.batch_effects({"runs": runs})
    assert (out["batch"], out["steps"], out["seeds"]) == (128, 600, [0])
    assert out["switch_minus_dense"] == {0: pytest.approx(-0.05)}
    assert out["switch_minus_dense_at_batch_32"] == {0: pytest.approx(0.05)}
    assert out["switch_better"]["runs"] == [switch.name, dense.name]
    assert out["switch_better"]["better"] is True
    # seed 2's pair: the verdict pairs the two seeds' gaps (-0.05, +0.02); seed 2 has no
    # batch-32 pair here, so only seed 0 has a gap there
    d2, s2 = span_runs.batched(2)
    runs[d2.name] = summary([200, 600], [4.0, 3.30], seed=2, model="dense_sc_cpu",
                            flags=d2.flags)
    runs[s2.name] = summary([200, 600], [4.0, 3.32], seed=2, model="switch_sc_cpu_8",
                            flags=s2.flags)
    out = span_effects.batch_effects({"runs": runs})
    assert out["seeds"] == [0, 2] and out["dense"] == {0: 3.40, 2: 3.30}
    assert out["switch_minus_dense"] == {0: pytest.approx(-0.05), 2: pytest.approx(0.02)}
    assert out["switch_minus_dense_at_batch_32"] == {0: pytest.approx(0.05)}
    paired = out["switch_better"]
    assert paired["seeds"] == [0, 2] and paired["noise_from"] == "paired"
    assert paired["margin"] == pytest.approx(0.015)


def test_the_4x_batch_pair_is_refused_outside_the_2400_step_study(tmp_path, capsys):
    (tmp_path / "train.txt").write_text("text\n")
    assert span_claims.main(["--out", str(tmp_path / "o"), "--corpus", str(tmp_path),
                             "--steps", "12000", "--runs", "dense_lr0.04_b128"]) == 2
    assert "the 2,400-step study's" in capsys.readouterr().err
    assert not (tmp_path / "o" / "dense_lr0.04_b128").exists()


def test_the_long_pair_at_four_times_the_batch_is_read_beside_batch_32_at_the_same_tokens(
        tmp_path):
    dense, switch = span_runs.batched(1, 12000)
    assert (dense.name, switch.name) == ("dense_lr0.04_b128_long_s1",
                                         "switch_8_nojitter_lr0.04_b128_long_s1")
    assert (switch.steps, switch.eval_every, switch.baseline) == (3000, 250, dense.name)
    assert [r.seed for r in span_runs.BATCHED_LONG] == [0, 0, 1, 1]
    # the run evaluates (and checkpoints) every 250 of its steps: 1,000 of the study's, in tokens
    study = harness.Study("s", "configs/c4_cpu.py", span_runs.ALL, steps=12000, eval_every=1000)
    cmd = harness.command(study, switch, tmp_path, None)
    assert "--config.eval_every_steps=250" in cmd and "--config.checkpoint_every_steps=250" in cmd
    assert any(c.endswith("steps=3000") for c in cmd) and "--config.seed=1" in cmd
    assert "--config.eval_every_steps=1000" in harness.command(
        study, span_runs.rated(0.04, 1)[0], tmp_path, None)
    runs = {"dense_lr0.04_s1": summary([4000, 8000, 12000], [3.1, 2.8, 2.69], seed=1),
            "switch_8_nojitter_lr0.04_s1": summary([4000, 8000, 12000], [3.12, 2.9, 2.82], seed=1),
            dense.name: summary([1000, 2000, 3000], [3.2, 2.9, 2.80], seed=1),
            switch.name: summary([1000, 2000, 3000], [3.1, 2.85, 2.78], seed=1)}
    assert span_effects.batch_effects({"runs": runs}) == {}         # the 2,400-step pair: none
    out = span_effects.batch_effects({"runs": runs}, 12000)
    assert (out["batch"], out["steps"], out["seeds"]) == (128, 3000, [1])
    assert out["switch_minus_dense"] == {1: pytest.approx(-0.02)}
    assert out["switch_minus_dense_at_batch_32"] == {1: pytest.approx(0.13)}
    tokens = out["by_tokens"][1]
    assert tokens["steps_at_batch_32"] == [4000, 8000, 12000]
    assert tokens["switch_minus_dense"] == pytest.approx([-0.1, -0.05, -0.02])
    assert tokens["switch_minus_dense_at_batch_32"] == pytest.approx([0.02, 0.1, 0.13])
    assert out["switch_better"]["runs"] == [switch.name, dense.name]
    # at the scaled rate: its own runs, read beside the batch-32 pair at 0.04
    assert span_effects.batch_effects({"runs": runs}, 12000, span_runs.SCALED_RATE) == {}
    d8, s8 = span_runs.batched(1, 12000, span_runs.SCALED_RATE)
    assert (d8.name, s8.name) == ("dense_lr0.08_b128_long_s1",
                                  "switch_8_nojitter_lr0.08_b128_long_s1")
    assert "--config.learning_rate=0.08" in s8.flags and s8.baseline == d8.name
    assert {r.name for r in span_runs.BATCHED_SCALED} >= {d8.name, s8.name}
    runs.update({d8.name: summary([1000, 2000, 3000], [3.0, 2.8, 2.70], seed=1),
                 s8.name: summary([1000, 2000, 3000], [3.0, 2.7, 2.65], seed=1)})
    out = span_effects.batch_effects({"runs": runs}, 12000, span_runs.SCALED_RATE)
    assert out["learning_rate"] == 0.08 and out["dense"] == {1: 2.70}
    assert out["switch_minus_dense"] == {1: pytest.approx(-0.05)}
    assert out["switch_minus_dense_at_batch_32"] == {1: pytest.approx(0.13)}


def test_the_long_4x_batch_pair_is_refused_outside_the_long_study(tmp_path, capsys):
    (tmp_path / "train.txt").write_text("text\n")
    for flags, run in ((["--steps", "2400"], "dense_lr0.04_b128_long_s1"),
                       (["--steps", "12000", "--eval-every", "200"], "dense_lr0.04_b128_long_s1"),
                       (["--steps", "2400"], "switch_8_nojitter_lr0.08_b128_long")):
        assert span_claims.main(["--out", str(tmp_path / "o"), "--corpus", str(tmp_path),
                                 *flags, "--runs", run]) == 2
        err = capsys.readouterr().err
        assert "the 12,000-step study's" in err and "--eval-every 1000" in err
    assert not (tmp_path / "o").exists()


def test_each_model_at_its_best_rate_is_judged_over_the_seeds_both_rates_ran():
    """dense at 0.04 has two bad seeds of four; at 0.02 it ran seeds 0 and 1. Over all their
    seeds 0.02's mean (3.38) is lower than 0.04's (3.40), but on the seeds both ran 0.04 is the
    better rate (3.35 against 3.38): the best rate is 0.04, and Switch-8 at its best is
    compared with dense there, paired by seed."""
    def runs_at(stem, model, rate, losses, extra=()):
        flags = [f"--config.learning_rate={rate:g}", *extra]
        return {harness.seeded_name(f"{stem}_lr{rate:g}", seed):
                summary([2400], [loss], seed=seed, model=model, flags=flags)
                for seed, loss in losses.items()}
    nojitter = ("--config.moe.jitter=0",)
    runs = {**runs_at("dense", "dense_sc_cpu", 0.04, {0: 3.2, 1: 3.5, 2: 3.3, 3: 3.6}),
            **runs_at("dense", "dense_sc_cpu", 0.02, {0: 3.36, 1: 3.40}),
            **runs_at("switch_8_nojitter", "switch_sc_cpu_8", 0.04,
                      {0: 3.25, 1: 3.26, 2: 3.27, 3: 3.28}, nojitter),
            **runs_at("switch_8_nojitter", "switch_sc_cpu_8", 0.02, {0: 3.45, 1: 3.44}, nojitter),
            **runs_at("switch_8_nojitter", "switch_sc_cpu_8", 0.08, {2: 3.20}, nojitter)}
    out = span_effects.at_best_mean_rate({"runs": runs})
    assert out["best_rate"] == {"dense": 0.04, "switch_8_nojitter": 0.04}
    assert out["mean_by_rate"]["dense"]["0.02"] == {"mean": 3.38, "seeds": [0, 1]}
    assert "0.08" not in out["mean_by_rate"]["switch_8_nojitter"]          # one seed: not read
    c = out["switch_better"]
    assert c["runs"] == ["switch_8_nojitter_lr0.04", "dense_lr0.04"]
    assert c["seeds"] == [0, 1, 2, 3]
    assert c["gaps"] == [pytest.approx(g) for g in (-0.05, 0.24, 0.03, 0.32)]
    # dense better at 0.02 on the seeds both ran: 0.02 is its best
    runs.update(runs_at("dense", "dense_sc_cpu", 0.02, {0: 3.1, 1: 3.2}))
    assert span_effects.at_best_mean_rate({"runs": runs})["best_rate"]["dense"] == 0.02


def test_dense_with_switchs_parameters_is_read_against_the_long_pair_at_its_own_steps():
    """A wide dense run stopped short of the long pair's 12,000 steps (the same schedule) is
    judged at its last step against dense and Switch-8's evaluations there, not against their
    final losses, and seeds stopped at unlike steps are not paired."""
    long = [2000, 4000, 6000, 12000]
    wide = {r.seed: r for r in span_runs.WIDE}
    assert wide[1].name == "dense_wide_lr0.04_s1" and wide[1].baseline == "dense_lr0.04_s1"
    assert wide[0].model == "dense_sc_cpu_wide" and wide[0].steps == 12000
    runs = {}
    for seed, d, s, w in ((0, [3.3, 3.06, 2.92, 2.72], [3.37, 3.13, 3.01, 2.84], [3.2, 3.0, 2.85]),
                          (1, [3.46, 3.11, 2.96, 2.69], [3.42, 3.12, 3.00, 2.82], [3.4, 3.0, 2.9])):
        dense, switch = span_runs.rated(0.04, seed)
        runs[dense.name] = summary(long, d, seed=seed, model=dense.model, flags=dense.flags)
        runs[switch.name] = summary(long, s, seed=seed, model=switch.model, flags=switch.flags)
        runs[wide[seed].name] = summary(long[:3], w, seed=seed, model=wide[seed].model,
                                        flags=wide[seed].flags)
    out = span_effects.wide_effects({"runs": runs})
    assert out["at_step"] == 6000
    s0 = out["by_seed"][0]
    assert s0["steps"] == [2000, 4000, 6000]
    assert s0["dense_wide_minus_dense"] == [pytest.approx(g) for g in (-0.1, -0.06, -0.07)]
    assert s0["switch_8_nojitter_minus_dense"][-1] == pytest.approx(0.09)
    c = out["wide_better_than_dense"]
    assert c["runs"] == ["dense_wide_lr0.04", "dense_lr0.04"]
    assert c["seeds"] == [0, 1] and c["gaps"] == [pytest.approx(0.07), pytest.approx(0.06)]
    assert c["noise_from"] == "paired" and c["verdict"] == "better, beyond noise"
    s = out["switch_better_than_wide"]
    assert s["gaps"] == [pytest.approx(-0.16), pytest.approx(-0.10)]
    assert s["verdict"] == "worse, within noise"          # -0.13 against 0.381 (1 df)
    # seed 1 stopped at 4,000 steps: its curve is reported, but no verdict pairs unlike steps
    runs[wide[1].name] = summary(long[:2], [3.4, 3.0], seed=1, model=wide[1].model,
                                 flags=wide[1].flags)
    out = span_effects.wide_effects({"runs": runs})
    assert set(out["by_seed"]) == {0, 1} and "at_step" not in out
    assert span_effects.wide_effects({"runs": {}}) == {}
