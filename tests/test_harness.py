"""experiments/harness.py end to end on two tiny runs: they train (the first one trains the
vocabulary the second reads), a second harness.run trains nothing, a longer run continues from
its checkpoint, collect / write give the curves, the comparison with the baseline, the commit
and the machine, and evaluate leaves the results.json that eval.py --table reads."""
import dataclasses
import json
import pathlib
import random
import sys

from conftest import FAST_COMPILE

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "experiments"))

import harness  # noqa: E402

WORDS = {"the": ["cat", "dog", "teacher", "river", "machine", "garden", "city", "child"],
         "verb": ["sees", "likes", "finds", "carries", "follows", "remembers", "builds"],
         "adj": ["small", "old", "quiet", "bright", "heavy", "green", "busy"],
         "end": ["in the morning", "near the house", "after the rain", "every day",
                 "with care", "on the hill"]}


def sentences(n: int) -> str:
    rng = random.Random(0)
    pick = lambda k: rng.choice(WORDS[k])    # noqa: E731
    return "".join(f"The {pick('adj')} {pick('the')} {pick('verb')} the {pick('adj')} "
                   f"{pick('the')} {pick('end')}.\n" for _ in range(n))


def study(text: pathlib.Path, steps: int = 4) -> harness.Study:
    return harness.Study(
        name="harness_smoke", config="configs/mini.py", steps=steps, eval_every=2,
        runs=[harness.Run("dense", "dense_tiny", baseline="dense"),
              harness.Run("switch", "switch_tiny", baseline="dense")],
        flags=("--config.data.source=files", "--config.data.pair=en-de",
               f"--config.data.train_files={text}",
               "--config.data.vocab_size=48", "--config.data.max_eval_examples=8",
               "--config.per_device_batch_size=4", "--config.max_length=32",
               "--config.warmup_steps=2"))


def test_two_runs_resume_collect_write_and_evaluate(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", FAST_COMPILE)     # the runs: one CPU device each
    text = tmp_path / "text.txt"
    text.write_text(sentences(200), encoding="utf-8")
    out, docs = tmp_path / "runs", tmp_path / "docs"
    s = study(text)
    commands = []
    harness.run(s, out, log=commands.append)
    assert len(commands) == 2 and "vocab_path" in commands[1] and "vocab_path" not in commands[0]
    shared = dataclasses.replace(s, vocab=out / "dense" / "tokenizer.model")   # a given one
    for r in shared.runs:                                            # every run reads it
        cmd = harness.command(shared, r, out, harness.vocabulary(shared, out, r))
        assert cmd.count(f"--config.data.vocab_path={out / 'dense' / 'tokenizer.model'}") == 1
    for name in ("dense", "switch"):
        assert harness.finished(s, s.get(name), out)
        assert [r["step"] for r in harness.rows(out / name, "eval")] == [2, 4]
    before = (out / "switch" / "metrics.jsonl").read_text()
    harness.run(s, out, log=commands.append)                         # all finished: a no-op
    assert len(commands) == 2 and (out / "switch" / "metrics.jsonl").read_text() == before

    longer = study(text, steps=6)                              # continues, not restarts
    harness.run(longer, out, only=["switch"], log=commands.append)
    assert len(commands) == 3 and "steps=6" in commands[2]
    assert (out / "switch" / "metrics.jsonl").read_text().startswith(before)
    assert [r["step"] for r in harness.rows(out / "switch", "eval")] == [2, 4, 6]
    assert harness.finished(longer, longer.get("switch"), out)
    assert not harness.finished(longer, longer.get("dense"), out)

    result = harness.collect(s, out, "pytest")
    dense, switch = result["runs"]["dense"], result["runs"]["switch"]
    assert dense["steps"] == [2, 4] and switch["steps"] == [2, 4, 6]
    assert all(x > 0 for x in dense["eval_loss"] + switch["eval_loss"])
    assert dense["tokens_seen"] > 0 and switch["tokens_seen"] > dense["tokens_seen"]
    assert switch["eval_loss_minus_baseline"] == round(
        switch["final_eval_loss"] - dense["final_eval_loss"], 4)
    assert "eval_loss_minus_baseline" not in dense                  # its own baseline
    assert switch["max_over_mean_expert_load_eval"] and switch["router_curves"]["step"]
    # the training cross-entropy before each evaluation; its last is the last interval's
    assert len(switch["train_cross_entropy"]) == 3 and switch["train_cross_entropy"][0] > 0
    assert dense["train_cross_entropy"][-1] == dense["train_cross_entropy_last_interval"]
    assert len(result["commit"]) == 40 and result["machine"]["devices"] >= 1
    assert switch["commit"] == result["commit"] and switch["seconds"] > 0

    text = harness.markdown(result, [harness.COLUMNS[k] for k in ("run", "loss", "vs_baseline")])
    header, rule, dense_row, switch_row = text.splitlines()
    assert header == "| run | final held-out loss | vs baseline |" and rule == "|---|---|---|"
    assert dense_row == f"| dense | {dense['final_eval_loss']:.4f} | — |"      # its own baseline
    assert switch_row.endswith(f" | {switch['eval_loss_minus_baseline']:+.4f} |")

    path = harness.write(result, docs, harness.plot_curves)
    assert json.loads(path.read_text())["runs"]["switch"]["steps"] == [2, 4, 6]
    figure = docs / "figures" / "harness_smoke.png"
    assert figure.read_bytes().startswith(b"\x89PNG")
    assert harness.write({**result, "runs": {}}, docs / "empty") is None
    assert not (docs / "empty").exists()

    harness.evaluate(longer, out, log=commands.append)               # dense is unfinished at 6
    assert len(commands) == 4 and "switch" in commands[3]
    results = json.loads((out / "switch" / "results.json").read_text())
    assert results["step"] == 6 and not (out / "dense" / "results.json").exists()
    harness.evaluate(longer, out, log=commands.append)               # up to date: a no-op
    assert len(commands) == 4


def test_the_run_record_keeps_what_another_process_wrote_meanwhile(tmp_path, monkeypatch):
    """A study split over two processes on one out (as routing_family --runs a / --runs b):
    each run's seconds and commit survive the other process's write during the run."""
    s = harness.Study(name="record", config="configs/mini.py", steps=2, eval_every=1,
                      runs=[harness.Run("a", "dense_tiny"), harness.Run("b", "dense_tiny")],
                      vocab=tmp_path / "given.model")

    def fake_train(study, run, out, flags=(), log=print):     # the other process finishes b
        other = harness._seconds(out)
        other.setdefault("commits", {})["b"] = "other-commit"
        other["b"] = 12.5
        (out / "seconds.json").write_text(json.dumps(other))

    monkeypatch.setattr(harness, "train", fake_train)
    monkeypatch.setattr(harness, "commit", lambda: "this-commit")
    harness.run(s, tmp_path, only=["a"])
    record = json.loads((tmp_path / "seconds.json").read_text())
    assert record["commits"] == {"a": "this-commit", "b": "other-commit"}
    assert record["b"] == 12.5 and record["a"] >= 0


def test_a_run_out_no_longer_holds_is_carried_from_the_published_result_of_the_same_text(
        tmp_path):
    """runs/ is scratch (a new checkout starts without it): collect takes a run --out does not
    hold from the published JSON, but only one trained on the same text in the same tokens."""
    docs = tmp_path / "docs"
    docs.mkdir()
    corpus = {"sha1": "c0", "train": {"tokens": 1000}, "eval": {"tokens": 20}}

    def run(losses, baseline):
        return {"model": "m", "flags": [], "seed": 0, "baseline": baseline, "finished": True,
                "steps": [2, 4], "eval_loss": losses, "final_eval_loss": losses[-1],
                "commit": "1234567aaa"}
    (docs / "s.json").write_text(json.dumps({
        "commit": "abcdef0123", "corpus": corpus,
        "runs": {"dense": run([5.0, 4.0], "dense"), "switch": run([4.5, 3.8], "dense")}}))
    lines = []
    carried = harness.published_runs("s", {**corpus, "tokenizer_sha1": "t"}, docs, lines.append)
    assert set(carried) == {"dense", "switch"} and not lines
    assert carried["switch"]["carried_from"] == "docs/s.json at abcdef0"
    for other, differs in (({**corpus, "sha1": "c1"}, "sha1"),
                           ({**corpus, "eval": {"tokens": 21}}, "eval.tokens"),
                           ({"sha1": "c0"}, "train.tokens, eval.tokens")):
        assert harness.published_runs("s", other, docs, lines.append) == {}
        assert lines[-1].endswith(f"its corpus differs from this one in {differs}")
    assert harness.published_runs("none", corpus, docs, lines.append) == {}   # nothing published

    s = harness.Study(name="s", config="configs/mini.py", steps=4, eval_every=2,
                      runs=[harness.Run("dense", "dense_tiny", baseline="dense"),
                            harness.Run("switch", "switch_tiny", baseline="dense"),
                            harness.Run("gone", "dense_tiny")])
    result = harness.collect(s, tmp_path / "runs", "cmd", published=carried)
    assert list(result["runs"]) == ["dense", "switch"]      # "gone" is neither here nor there
    sw = result["runs"]["switch"]
    assert sw["commit"] == "1234567aaa" and sw["eval_loss_minus_baseline"] == -0.2
    assert sw["steps_to_baseline_final_loss"] == 3          # dense's 4.0 at 2 + 0.5 / 0.7 x 2
