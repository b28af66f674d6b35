"""The arithmetic every "steps to dense's loss" and holds / fails verdict of the claims studies
comes from, on hand-worked curves and losses: verdicts.reach_step and the baseline comparison,
the seed spread, the one noise rule (switchzoo.noise), lm_claims.claims,
routing_family.findings; and harness.write, which leaves a published result alone unless asked.
Pure Python: no run trains here."""
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "experiments"))

import harness  # noqa: E402
import lm_claims  # noqa: E402
import rejudge  # noqa: E402
import reuse  # noqa: E402
import routing_family  # noqa: E402
import verdicts  # noqa: E402


def test_reach_step_interpolates_between_the_evaluation_before_and_the_one_that_reaches():
    curve = [(200, 5.0), (400, 4.0), (600, 3.8)]
    # 4.25 is a quarter of the way from 4.0 back to 5.0: 3/4 of the 200 steps after step 200
    assert verdicts.reach_step(curve, 4.25) == pytest.approx(350.0)
    assert verdicts.reach_step(curve, 3.9) == pytest.approx(500.0)     # between 400 and 600
    assert verdicts.reach_step(curve, 4.0) == 400.0                    # exactly at an evaluation


def test_reach_step_below_the_target_at_the_first_evaluation_or_never():
    # already there at the first evaluation: its step (the crossing before it is unseen)
    assert verdicts.reach_step([(200, 4.0), (400, 3.5)], 4.5) == 200.0
    assert verdicts.reach_step([(200, 5.0), (400, 4.8)], 4.5) is None
    assert verdicts.reach_step([], 4.5) is None


def test_reach_step_of_a_curve_that_rises_again_takes_the_first_crossing():
    curve = [(200, 5.0), (400, 4.2), (600, 4.6), (800, 4.1)]
    assert verdicts.reach_step(curve, 4.4) == pytest.approx(350.0)      # 200 + 0.6 / 0.8 x 200
    # 4.15 is first reached after the bump: from step 600's 4.6, not from the earlier 4.2
    assert verdicts.reach_step(curve, 4.15) == pytest.approx(780.0)     # 600 + 0.45 / 0.5 x 200


def summary(steps, losses, seed=0, model="m", baseline=None, flags=(), finished=True, **extra):
    return {"model": model, "flags": list(flags), "seed": seed, "baseline": baseline,
            "starts_from": None, "train_steps": steps[-1], "finished": finished,
            "steps": list(steps), "eval_loss": list(losses), "final_eval_loss": losses[-1],
            **extra}


def test_against_baselines_gives_the_step_its_fraction_and_the_final_difference():
    runs = {"dense": summary([200, 400, 600, 800], [5.0, 4.6, 4.4, 4.3], baseline="dense"),
            "fast": summary([200, 400, 600, 800], [4.9, 4.5, 4.2, 4.1], baseline="dense"),
            "slow": summary([200, 400, 600, 800], [5.2, 5.0, 4.9, 4.8], baseline="dense")}
    verdicts.against_baselines(runs)
    assert "steps_to_baseline_final_loss" not in runs["dense"]            # its own baseline
    # fast reaches dense's 4.3 between 400 (4.5) and 600 (4.2): 400 + 0.2 / 0.3 x 200 = 533.3
    assert runs["fast"]["steps_to_baseline_final_loss"] == 533
    assert runs["fast"]["fraction_of_baseline_steps"] == pytest.approx(0.667)
    assert runs["fast"]["eval_loss_minus_baseline"] == pytest.approx(-0.2)
    assert runs["slow"]["steps_to_baseline_final_loss"] is None
    assert runs["slow"]["fraction_of_baseline_steps"] is None


def test_seed_spread_is_max_minus_min_over_the_seeds_that_ran():
    result = {"runs": {"a": summary([10], [4.6264]), "a_s1": summary([10], [4.6152], seed=1)}}
    assert verdicts.seed_spread(result, ["a", "a_s1"]) == {
        "runs": ["a", "a_s1"], "mean": 4.6208, "spread": 0.0112}
    assert verdicts.seed_spread(result, ["a", "missing"]) is None


def lm_result() -> dict:
    """lm_claims' runs with hand-picked final losses (curves of two evaluations)."""
    def run(final, seed=0, model="switch_lm_cpu_8", flags=(), baseline="dense", drops=None,
            finished=True):
        return summary([100, 200], [final + 0.5, final], seed, model, baseline, flags,
                       finished, dropped_fraction_train=drops)
    top2, cf1 = ("--config.moe.top_k=2",), ("--config.moe.train_capacity_factor=1.0",)
    runs = {
        "dense": run(4.60, model="dense_lm_cpu"),
        "dense_s1": run(4.62, seed=1, model="dense_lm_cpu", baseline="dense_s1"),
        "switch_8": run(4.50, drops=[0.02, 0.03]),
        "switch_8_s1": run(4.54, seed=1, baseline="dense_s1", drops=[0.03, 0.03]),
        # one seed: like for like it is 0.03 ahead of switch_8's seed 0 (4.50), though behind
        # switch_8's two-seed mean (4.52) by less
        "switch_16": run(4.47, model="switch_lm_cpu_16"),
        "switch_32": run(4.46, model="switch_lm_cpu_32"),
        "dense_wide": run(4.48, model="dense_lm_cpu_wide"),
        "top2_8": run(4.45, flags=top2, drops=[0.341, 0.349]),
        "top2_8_cf1.0": run(4.49, flags=top2 + cf1, drops=[0.47, 0.48]),
        "switch_8_cf1.0": run(4.44, flags=cf1, drops=[0.08, 0.09], finished=False),
    }
    result = {"runs": runs, "steps": 200}
    verdicts.against_baselines(runs)
    return result


def test_lm_claims_judge_every_comparison_by_the_one_rule():
    c = lm_claims.claims(lm_result())
    # switch_8's seeds are 0.04 apart, dense's 0.02: the reference is switch_8's sd, 1 df
    assert c["reference_sd"] == {"sd": pytest.approx(0.0283, abs=1e-4), "df": 1}
    head = c["switch_8_beyond_noise"]
    assert head["seeds"] == [0, 1] and head["gaps"] == [0.1, 0.08]
    # sd of the gaps 0.0141: 12.71 x 0.0141 / sqrt(2) = 0.1271 at 1 df, above 0.09: two seeds
    # that agree to 0.02 do not yet show a 0.09 margin
    assert head["margin"] == 0.09 and head["noise"] == 0.1271 and head["noise_from"] == "paired"
    assert head["holds"] is False and head["df"] == 1
    # dense's 4.60 from 5.0 at step 100: 100 + 0.4 / 0.5 x 100 = 180 of 200; dense_s1's 4.62
    # from 5.04: 100 + 0.42 / 0.5 x 100 = 184
    assert c["switch_8_speedup"]["fraction_of_dense_steps"] == [0.9, 0.92]
    assert c["switch_8_speedup"]["holds"] is False
    dense_8, eight_16, sixteen_32 = c["more_experts_help"]["steps"]
    assert dense_8["seeds"] == [0, 1] and dense_8["beyond_noise"] is False
    assert eight_16["seeds"] == [0] and eight_16["margin"] == 0.03       # seed 0 against seed 0
    assert eight_16["noise_from"] == "reference" and eight_16["beyond_noise"] is False
    assert eight_16["noise"] == 0.5082             # 12.71 x sqrt(2) x 0.0283, the reference
    assert sixteen_32["margin"] == 0.01 and c["more_experts_help"]["holds"] is True
    wide = c["dense_upper_bound"]["against_dense_wide"]
    assert wide["switch_16"]["margin"] == 0.01 and wide["switch_16"]["better"] is True
    assert wide["switch_8"]["margin"] == -0.02 and wide["switch_8"]["beyond_noise"] is False
    top2 = c["top1_beats_top2"]["by_capacity"]
    assert list(top2) == ["1.25"]                         # switch_8_cf1.0 has not finished
    assert top2["1.25"]["margin"] == -0.05 and top2["1.25"]["verdict"] == "worse, within noise"
    assert top2["1.25"]["dropped_fraction_train"] == {"top2_8": [0.341, 0.349],
                                                      "switch_8": [0.02, 0.03]}


def test_lm_claims_second_seeds_repeat_their_seed_0_runs_and_are_judged_paired():
    """Each _s1 run of lm_claims.SECOND_SEEDS is its seed-0 run at seed 1 against dense_s1, and
    with both seeds an ordering that read one seed (against the reference spread) is paired."""
    runs = {r.name: r for r in lm_claims.RUNS}
    for name in lm_claims.SECOND_SEEDS:
        a, b = runs[name], runs[name + "_s1"]
        assert (b.model, b.flags, b.seed, b.baseline) == (a.model, a.flags, 1, "dense_s1")
    result = lm_result()
    before = lm_claims.claims(result)["switch_beats_dense_every_capacity"]["by_row"]["top2_8"]
    assert before["seeds"] == [0] and before["noise_from"] == "reference"
    top2 = ("--config.moe.top_k=2",)
    result["runs"]["top2_8_s1"] = summary([100, 200], [4.98, 4.48], 1, "switch_lm_cpu_8",
                                          "dense_s1", top2, True)
    result["runs"]["dense_wide_s1"] = summary([100, 200], [5.0, 4.50], 1, "dense_lm_cpu_wide",
                                              "dense_s1", (), True)
    verdicts.against_baselines(result["runs"])
    c = lm_claims.claims(result)
    row = c["switch_beats_dense_every_capacity"]["by_row"]["top2_8"]
    assert row["seeds"] == [0, 1] and row["gaps"] == [0.15, 0.14]   # 4.60 - 4.45, 4.62 - 4.48
    assert row["noise_from"] == "paired" and row["margin"] == 0.145 and row["noise"] == 0.0635
    wide = c["dense_upper_bound"]["against_dense_wide"]["switch_8"]
    assert wide["seeds"] == [0, 1] and wide["gaps"] == [-0.02, -0.04]  # 4.48 - 4.50, 4.50 - 4.54


def test_rejudge_recomputes_the_verdicts_of_the_script_that_wrote_the_result():
    old = {**lm_result(), "command": "python experiments/span_claims.py --out runs/span",
           "claims": {"switch_8_beyond_noise": {"holds": True, "seed_spread": 0.04}}}
    new = rejudge.rejudge(old)
    assert new["claims"] == lm_claims.claims(old) and new["runs"] is old["runs"]
    assert new["claims"]["switch_8_beyond_noise"]["holds"] is False
    with pytest.raises(SystemExit, match="written by switch_vs_dense.py"):
        rejudge.rejudge({**old, "command": "python experiments/switch_vs_dense.py --out x"})


def test_routing_family_findings_from_hand_worked_curves():
    runs = {
        "dense": summary([100, 200], [4.0, 3.5], model="t5_cpu", baseline=None),
        "top1": summary([100, 200], [3.9, 3.4], model="switch_cpu_8", baseline="dense",
                        dropped_fraction_train=[0.01, 0.02]),
        "top2": summary([100, 200], [3.95, 3.45], model="switch_cpu_8", baseline="top1",
                        flags=["--config.moe.top_k=2"], dropped_fraction_train=[0.3, 0.35]),
        "dense_cont": summary([50, 100], [3.6, 3.4], model="t5_cpu", baseline=None),
        # upcycled: 3.5 then 3.3, so it reaches dense_cont's 3.4 halfway: step 75
        "upcycled": summary([50, 100], [3.5, 3.3], model="switch_cpu_8", baseline="dense_cont"),
        "student": summary([100, 200], [3.6, 3.45], model="t5_cpu", baseline="dense"),
    }
    verdicts.against_baselines(runs)
    f = routing_family.findings({"runs": runs, "steps": 200})
    assert f["dense_loss_at_half"] == 4.0                       # dense at step 100
    assert f["top2_minus_top1"] == pytest.approx(0.05)
    assert f["top2_vs_top1"] == "worse, no noise estimate"      # one seed, no spread measured
    assert f["dropped_fraction_train"] == {"top1": [0.01, 0.02], "top2": [0.3, 0.35]}
    assert f["upcycled_minus_dense_cont"] == [-0.1, -0.1]
    assert f["upcycled_steps_to_dense_cont_final"] == 75
    assert f["teacher_gain"] == pytest.approx(0.1)
    assert f["student_gain"] == pytest.approx(0.05)
    assert f["student_share_of_teacher_gain"] == pytest.approx(0.5)


def test_routing_family_judges_the_upcycling_pair_over_the_seeds_of_other_results():
    """--seed 1 --with the seed-0 result: the pair is judged like for like over both seeds
    (upcycled 0.1 and 0.05 below dense_cont: margin 0.075, noise 0.05, within 2x), each result's own
    runs left as they are."""
    def result(seed, cont, up):
        runs = {"dense_cont": summary([50, 100], cont, seed=seed, model="t5_cpu"),
                "upcycled": summary([50, 100], up, seed=seed, model="switch_cpu_8",
                                    baseline="dense_cont")}
        verdicts.against_baselines(runs)
        return {"runs": runs, "steps": 200}
    zero, one = result(0, [3.6, 3.4], [3.5, 3.3]), result(1, [3.7, 3.5], [3.6, 3.45])
    alone = routing_family.findings(one)
    assert alone["upcycled_vs_dense_cont"] == "better, no noise estimate"
    assert "upcycled_vs_dense_cont_seeds" not in alone
    f = routing_family.findings(one, [zero])
    both = f["upcycled_vs_dense_cont_seeds"]
    assert both["seeds"] == [0, 1] and both["gaps"] == [0.1, 0.05]      # dense_cont - upcycled
    assert both["margin"] == pytest.approx(0.075) and both["noise"] == pytest.approx(0.3177)
    assert f["upcycled_vs_dense_cont"] == both["verdict"] == "better, within noise"
    assert f["upcycled_minus_dense_cont"] == [-0.1, -0.05]          # this seed's curve
    assert set(one["runs"]) == {"dense_cont", "upcycled"}


def test_distillation_is_judged_against_dense_trained_as_long_as_teacher_and_student():
    """Teacher 0.1 below dense; dense_long (dense continued to twice the steps) 0.08 below
    dense; the student 0.03 below dense_long, student_init 0.01 below it: the shares against
    dense_long are 0.03 / 0.1 and 0.01 / 0.1 of the teacher's gain, and on two seeds each pair
    is judged by its paired gaps."""
    def result(seed, shift):
        runs = {"dense": summary([100, 200], [4.0 + shift, 3.5 + shift], seed=seed,
                                 model="dense_lm_cpu", baseline=None),
                "top1": summary([100, 200], [3.9 + shift, 3.4 + shift], seed=seed,
                                model="switch_lm_cpu_8", baseline="dense"),
                "dense_long": summary([200, 400], [3.5 + shift, 3.42 + shift], seed=seed,
                                      model="dense_lm_cpu", baseline=None),
                "student": summary([100, 200], [3.5 + shift, 3.39 + shift], seed=seed,
                                   model="dense_lm_cpu", baseline="dense",
                                   flags=["--config.distill.weight=0.25"]),
                "student_init": summary([100, 200], [3.52 + shift, 3.41 + shift - seed * 0.01],
                                        seed=seed, model="dense_lm_cpu", baseline="dense",
                                        flags=["--config.distill.weight=0.0"])}
        verdicts.against_baselines(runs)
        return {"runs": runs, "steps": 200}
    zero, one = result(0, 0.0), result(1, 0.05)
    f = routing_family.findings(zero)
    assert f["dense_long_minus_dense"] == pytest.approx(-0.08)
    assert f["student_minus_dense_long"] == pytest.approx(-0.03)
    assert f["student_share_vs_dense_long"] == pytest.approx(0.3)
    assert f["student_init_share_vs_dense_long"] == pytest.approx(0.1)
    both = routing_family.findings(zero, [one])
    # student vs dense_long: gaps 0.03 and 0.03, no spread -> beyond noise
    assert both["student_vs_dense_long"]["gaps"] == [0.03, 0.03]
    assert both["student_vs_dense_long"]["verdict"] == "better, beyond noise"
    # the teacher's probabilities alone: gaps 0.02 (seed 0) and 0.01 (seed 1): margin 0.015,
    # noise 0.01 -> within 2x
    s = both["student_vs_student_init"]
    assert s["gaps"] == [0.02, 0.01] and s["verdict"] == "better, within noise"


def test_mtf_rungs_are_judged_over_seeds_by_loss_and_by_the_tables_metric():
    """Two seeds of a two-rung series: h2 is 0.1 and 0.2 BLEU above h1 (margin 0.15, noise
    0.1: within 2x) and its loss 0.05 below on both (beyond)."""
    import mtf_tables

    def result(seed, bleu1, bleu2, shift):
        runs = {"h1": summary([300], [2.5 + shift], seed=seed, model="mtf_wmt_cpu_h1",
                              baseline=None),
                "h2": summary([300], [2.45 + shift], seed=seed, model="mtf_wmt_cpu_h2",
                              baseline="h1")}
        return {"runs": runs, "table": {"metric": "bleu", "results": {
            "h1": {"bleu": bleu1}, "h2": {"bleu": bleu2}}}}
    zero, one = result(0, 20.0, 20.1, 0.0), result(1, 19.0, 19.2, 0.1)
    seeds = mtf_tables.rungs_over_seeds(zero, [one])
    h2 = seeds["h2"]
    assert h2["bleu_by_seed"] == {"0": 20.1, "1": 19.2} and h2["bleu_mean"] == 19.65
    assert h2["bleu_vs_below"]["gaps"] == [0.1, 0.2]
    assert h2["bleu_vs_below"]["verdict"] == "better, within noise"
    assert h2["loss_vs_below"]["verdict"] == "better, beyond noise"
    assert "loss_vs_below" not in seeds["h1"] and seeds["h1"]["bleu_mean"] == 19.5
    # a seed that trained h1 alone judges no rung: h2 is judged where it ran
    alone = {**one, "runs": {"h1": one["runs"]["h1"]}}
    assert "bleu_vs_below" not in mtf_tables.rungs_over_seeds(alone, [zero])["h2"]


def test_routing_family_lm_study_on_another_seed_reads_one_vocabulary(tmp_path):
    args = routing_family.arguments(["--regime", "lm", "--corpus", str(tmp_path), "--out",
                                     str(tmp_path / "out"), "--seed", "1", "--vocab",
                                     str(tmp_path / "tokenizer.model")])
    s = routing_family.study(args, None)
    assert s.vocab == (tmp_path / "tokenizer.model").resolve()
    assert {r.seed for r in s.runs} == {1} and s.get("upcycled").steps == 1200
    assert s.get("dense").model == "dense_lm_cpu" and s.steps == 2400


def test_routing_family_lm_study_at_another_rate_reuses_named_workdirs(tmp_path):
    """--lr reaches every run's flags (and so --seeds-from's recipe check); --reuse RUN=WORKDIR
    names the runs that stand for dense and top1 (e.g. the LR sweep's); dense_long trains twice
    the study's steps, continuing dense."""
    args = routing_family.arguments([
        "--regime", "lm", "--corpus", str(tmp_path), "--out", str(tmp_path / "out"),
        "--lr", "0.04", "--reuse", f"dense={tmp_path / 'sweep' / 'dense_lr0.04'}",
        f"top1={tmp_path / 'sweep' / 'switch_8_lr0.04'}"])
    s = routing_family.study(args, None)
    assert "--config.learning_rate=0.04" in s.flags
    assert reuse.sources(args) == {
        "dense": tmp_path / "sweep" / "dense_lr0.04", "top1": tmp_path / "sweep" / "switch_8_lr0.04"}
    long = s.get("dense_long")
    assert (long.steps, long.model, long.starts_from) == (4800, "dense_lm_cpu", "continues:dense")
    assert "dense_long" in args.runs                      # one of the study's runs by default
    lm_out = routing_family.arguments(["--regime", "lm", "--corpus", str(tmp_path), "--out",
                                       str(tmp_path), "--seed", "1", "--reuse", "runs/lm"])
    assert reuse.sources(lm_out) == {          # lm_claims' names, seed 1's
        "dense": pathlib.Path("runs/lm/dense_s1"), "top1": pathlib.Path("runs/lm/switch_8_s1")}
    bad = routing_family.arguments(["--regime", "lm", "--corpus", str(tmp_path), "--out",
                                    str(tmp_path), "--reuse", "student=x"])
    with pytest.raises(SystemExit, match="only dense and top1 can be reused"):
        reuse.sources(bad)
    assert reuse.config_value(s, "learning_rate") == 0.01     # the config's own


def test_a_result_goes_beside_its_runs_and_replaces_the_published_one_only_when_asked(tmp_path):
    docs, out = tmp_path / "docs", tmp_path / "runs"
    (docs / "figures").mkdir(parents=True)
    published = docs / "study.json"
    published.write_text('{"the": "published result"}')
    result = {"study": "study", "runs": {"dense": {}}}
    lines = []

    def plot(res, path):
        path.write_bytes(b"png")
    path = harness.write(result, out, plot, docs=docs, log=lines.append)
    assert path == out / "study.json" and (out / "figures" / "study.png").read_bytes() == b"png"
    assert published.read_text() == '{"the": "published result"}'
    assert "--publish replaces it" in lines[-1]
    with pytest.raises(SystemExit, match=r"study\.json is a published result; pass --publish"):
        harness.write(result, out, docs=docs, path=published)
    assert published.read_text() == '{"the": "published result"}'
    assert harness.write(result, out, plot, publish=True, docs=docs, log=lines.append) == published
    assert json.loads(published.read_text()) == result
    assert (docs / "figures" / "study.png").is_file()
    assert "0 orderings" in (docs / "orderings.md").read_text()   # rewritten on publishing


def test_train_and_held_out_gaps_show_a_run_fitting_seen_text_faster():
    run = summary([200, 400, 600], [4.0, 3.7, 3.6], train_cross_entropy=[4.1, 3.6, 3.3])
    base = summary([200, 400, 600], [4.1, 3.8, 3.62], train_cross_entropy=[4.2, 3.75, 3.5])
    c = verdicts.train_and_held_out(run, base)
    assert c["steps"] == [200, 400, 600]
    assert c["held_out_minus_baseline"] == [-0.1, -0.1, -0.02]      # the lead shrinks held out
    assert c["train_minus_baseline"] == [-0.1, -0.15, -0.2]         # and grows in training
    assert c["generalisation_gap"] == [-0.1, 0.1, 0.3]
    assert c["baseline_generalisation_gap"] == [-0.1, 0.05, 0.12]
    # an interval without logged training is left out; results from before the curves: None
    gappy = {**run, "train_cross_entropy": [None, 3.6, 3.3]}
    assert verdicts.train_and_held_out(gappy, base)["steps"] == [400, 600]
    old = {k: v for k, v in base.items() if k != "train_cross_entropy"}
    assert verdicts.train_and_held_out(run, old) is None
    result = {"runs": {"s": run, "d": base, "old": old,
                       "going": {**run, "finished": False}}}
    assert list(verdicts.train_and_held_out_pairs(
        result, [("s", "d"), ("s", "old"), ("going", "d"), ("s", "absent")])) == ["s"]


def test_every_published_verdict_is_judged_by_todays_rule():
    """docs/*.json hold their verdicts as today's rule judges them (experiments/rejudge.py
    --all: the script judges, and every other verdict from its recorded same-seed gaps): a
    change of the rule re-publishes them and lists what changed."""
    assert rejudge.rejudge_all(publish=False) == []
