"""experiments/orderings.py: every verdict the published studies carry, in one table that
cannot go stale (docs/orderings.md is checked against the committed JSON)."""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import orderings  # noqa: E402


def verdict(runs, seeds, gaps, word="better, beyond noise"):
    return {"runs": runs, "seeds": seeds, "gaps": gaps, "margin": sum(gaps) / len(gaps),
            "noise": 0.01, "noise_from": "paired" if len(seeds) > 1 else "reference",
            "ratio": 2.5, "better": True, "beyond_noise": True, "verdict": word}


def test_every_verdict_once_with_its_seeds(tmp_path):
    pair = verdict(["switch_8", "dense"], [0, 1], [0.08, 0.09])
    (tmp_path / "a.json").write_text(json.dumps({"commit": "abcdef0123", "claims": {
        "headline": pair,
        "ladder": {"steps": [pair, verdict(["switch_16", "switch_8"], [0], [0.02],
                                           "better, within noise")]},
        # judged by another metric: takes its sibling's runs
        "h2": {"loss_vs_below": verdict(["h2", "h1"], [0, 1], [0.02, 0.04]),
               "word_perplexity_vs_below": {**verdict(None, [0, 1], [50.0, 90.0]),
                                            "runs": None}}}}))
    (tmp_path / "b.json").write_text(json.dumps({"runs": {}, "note": [1, {"x": 2}]}))
    rows = orderings.collect(tmp_path)
    assert [(r["study"], r["claim"], r["runs"], r["seeds"]) for r in rows] == [
        ("a", "claims/headline", ["switch_8", "dense"], [0, 1]),      # the repeat left out
        ("a", "claims/ladder/steps[1]", ["switch_16", "switch_8"], [0]),
        ("a", "claims/h2/loss_vs_below", ["h2", "h1"], [0, 1]),
        ("a", "claims/h2/word_perplexity_vs_below", ["h2", "h1"], [0, 1])]
    text = orderings.markdown(rows)
    assert "**4 orderings; 3 rest on two or more seeds, 1 on one** (0 of which" in text
    assert "| 0 **(one)** | 0.02 |" in text and "`abcdef0`" in text


def test_a_one_seed_ordering_names_the_study_that_asks_it_again_on_more_seeds(tmp_path):
    one = verdict(["switch_16", "switch_8"], [0], [0.02], "better, within noise")
    (tmp_path / "a.json").write_text(json.dumps({"claims": {"steps": [one]},
                                                 "other": verdict(["x", "y"], [0], [0.1])}))
    (tmp_path / "b.json").write_text(json.dumps({"at_best": {"steps": [
        verdict(["switch_16", "switch_8"], [0, 1], [0.01, 0.03])]}}))
    # the same pair trained five times as long: another question, not asked again here
    (tmp_path / "c.json").write_text(json.dumps({"steps": 12000, "at_best": {"steps": [
        verdict(["switch_16", "switch_8"], [0], [-0.1])]}}))
    rows = orderings.collect(tmp_path)
    assert [r["study"] for r in rows] == ["a", "a", "b", "c"]
    assert orderings.elsewhere(rows) == {0: rows[2]}      # x vs y is asked nowhere else
    text = orderings.markdown(rows)
    assert "3 on one** (1 of which another study asks again" in text
    assert "| better, within noise | b (0, 1): better, beyond noise |" in text


def test_the_committed_table_is_fresh(capsys):
    assert orderings.main(["--check"]) == 0, capsys.readouterr().err
