"""experiments/finetune.py's arithmetic: its runs, the commands they train with, and the claims
judged over the seeds by switchzoo.noise (the runs themselves are the study, not a test)."""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "experiments"))

import finetune  # noqa: E402


def test_every_claim_has_both_seeds_of_its_runs():
    runs = finetune.runs()
    assert len(runs) == 10 and {r["seed"] for r in runs.values()} == {0, 1}
    args = argparse.Namespace(steps=600, eval_every=50, learning_rate=0.01,
                              task_dir=pathlib.Path("t"), out=pathlib.Path("o"),
                              pretrained=pathlib.Path("p"), vocab=pathlib.Path("v.model"))
    pretrained = finetune.command("switch_8_pretrained_edrop0.1_s1",
                                  runs["switch_8_pretrained_edrop0.1_s1"], args)
    assert "--config.finetune.expert_dropout=0.1" in pretrained and "--config.seed=1" in pretrained
    assert any(a.startswith("--config.init_from=") and a.endswith("switch_8_nojitter_lr0.08")
               for a in pretrained)
    scratch = finetune.command("dense_scratch_s0", runs["dense_scratch_s0"], args)
    assert not any("init_from" in a for a in scratch)
    assert any(a.endswith("v.model") and "vocab_path" in a for a in scratch)


def test_claims_are_judged_over_the_seeds_both_ran():
    acc = {"switch_8_pretrained": (74.0, 73.0), "switch_8_scratch": (72.0, 72.5),
           "dense_pretrained": (71.0, 71.0), "dense_scratch": (70.0, 70.0),
           "switch_8_pretrained_edrop0.1": (73.0, 73.5)}
    result = {"runs": {f"{stem}_s{seed}": {"seed": seed, "test": {"accuracy": a}}
                       for stem, values in acc.items() for seed, a in enumerate(values)},
              "baselines": {"vader": {"accuracy": 66.0}, "majority": {"accuracy": 50.0}}}
    c = finetune.comparisons(result)
    # gaps 2.0 and 0.5: margin 1.25, noise (paired t, 1 df: 12.71 x 1.06 / sqrt(2)) 9.53 ->
    # better, within noise
    assert (c["switch_pretrained_vs_scratch"]["margin"], c["switch_pretrained_vs_scratch"][
        "noise"], c["switch_pretrained_vs_scratch"]["verdict"]) == (1.25, 9.5297,
                                                                   "better, within noise")
    # against a constant baseline the gaps are the seeds' own: 8.0, 7.0 -> 7.5 over noise 6.35
    assert c["switch_pretrained_vs_vader"]["verdict"] == "better, beyond noise"
    assert c["expert_dropout_0.4_vs_0.1"]["gaps"] == [1.0, -0.5]
