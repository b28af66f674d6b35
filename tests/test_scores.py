"""Evaluation metrics and the paper tables: BLEU against a hand-computed oracle, perplexity on
hand numbers, results.json, and collect() on run dirs written here."""
import collections
import json
import math

import pytest

from switchzoo import scores, tables


# ------------------------------------------------------------------------------------- BLEU
def _hand_bleu(hyps, refs):
    """Plain corpus BLEU (Papineni et al.): clipped n-gram precisions for n = 1..4, geometric
    mean, brevity penalty; whitespace tokens, so only for text 13a leaves as it is."""
    matches, totals, hyp_len, ref_len = [0] * 4, [0] * 4, 0, 0
    for hyp, ref in zip(hyps, refs):
        h, r = hyp.split(), ref.split()
        hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
        for n in range(1, 5):
            hc = collections.Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
            rc = collections.Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
            matches[n - 1] += sum(min(c, rc[g]) for g, c in hc.items())
            totals[n - 1] += max(len(h) - n + 1, 0)
    log_p = sum(math.log(m / t) for m, t in zip(matches, totals)) / 4
    bp = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / hyp_len)
    return 100 * bp * math.exp(log_p)


HYPS = ["the cat sat on the mat today", "a quick brown dog jumped over the lazy fox"]
REFS = ["the cat sat on the red mat today", "the quick brown fox jumped over the lazy dog"]


def test_bleu_identical_text_is_100():
    assert scores.bleu(REFS, REFS) == pytest.approx(100.0)


def test_bleu_matches_hand_computed_bleu():
    ours = scores.bleu(HYPS, REFS)
    assert ours == pytest.approx(_hand_bleu(HYPS, REFS), abs=1e-9)
    # By hand: precisions 15/16, 9/14, 5/12, 3/10; 16 hypothesis words vs 17 reference words,
    # so brevity penalty exp(1 - 17/16).
    by_hand = 100 * math.exp(1 - 17 / 16) * (15 / 16 * 9 / 14 * 5 / 12 * 3 / 10) ** 0.25
    assert ours == pytest.approx(by_hand, abs=1e-9)
    assert ours == pytest.approx(49.2159, abs=1e-4)


def test_bleu_tokenizes_punctuation_13a():
    # 13a splits "mat." into "mat ." so a missing full stop costs n-grams, not the whole word.
    assert scores.bleu(["the cat sat on the mat"], ["the cat sat on the mat."]) < 100
    assert scores.bleu(["the cat sat on the mat ."], ["the cat sat on the mat."]) == \
        pytest.approx(100.0)


@pytest.mark.parametrize("hyps, refs, message", [
    (["a"], ["a", "b"], "1 hypotheses but 2 references"),
    ([], [], "no hypotheses"),
    (["\u2581the \u2581cat"], ["the cat"], "detokenized"),
    ([[1, 2]], ["the cat"], "not str"),
])
def test_bleu_errors(hyps, refs, message):
    with pytest.raises(ValueError, match=message):
        scores.bleu(hyps, refs)


# ------------------------------------------------------------------------------- perplexity
def test_perplexities_on_hand_numbers():
    # 10 subword tokens (EOS included) over 8 words, 20 nats in all.
    p = scores.perplexities(20.0, num_tokens=10, num_words=8)
    assert p["loss"] == pytest.approx(2.0)
    assert p["neg_log_perplexity"] == pytest.approx(-2.0)
    assert p["token_perplexity"] == pytest.approx(math.exp(2.0))
    assert p["word_perplexity"] == pytest.approx(math.exp(2.5))
    # word ppl = token ppl ** (tokens / words): the t2t 1.1078 rule is this identity.
    assert p["word_perplexity"] == pytest.approx(p["token_perplexity"] ** (10 / 8))
    assert scores.perplexities(20.0, 10, None)["word_perplexity"] is None


def test_count_words_counts_one_eos_per_text():
    assert scores.count_words(["the cat sat", "hello  world "]) == 3 + 1 + 2 + 1
    assert scores.count_words(["the cat sat"], eos=False) == 3


@pytest.mark.parametrize("args, message", [
    ((1.0, 0, 1), "num_tokens"), ((1.0, 3, 0), "num_words"),
    ((float("nan"), 3, 1), "finite"), ((-1.0, 3, 1), "finite"),
])
def test_perplexities_errors(args, message):
    with pytest.raises(ValueError, match=message):
        scores.perplexities(*args)


# ------------------------------------------------------------------------- results.json
def _results(step, loss, dropped=(0.02, 0.04), load=((0.2, 0.3, 0.25, 0.25),), **kw):
    return scores.make_results(step, "validation", total_nll=loss * 100, num_tokens=100,
                               num_words=80, dropped_fraction=dropped, expert_load=load, **kw)


def test_write_results_is_atomic_and_round_trips(tmp_path):
    import numpy as np
    results = _results(7, 1.5, bleu=np.float32(12.5), dropped=np.array([0.1, 0.3]))
    path = scores.write_results(tmp_path / "run", results)
    assert path.name == "results.json" and list(path.parent.iterdir()) == [path]  # no temp left
    back = json.loads(path.read_text())
    assert back["step"] == 7 and back["bleu"] == 12.5
    assert back["dropped_fraction"] == pytest.approx([0.1, 0.3])
    assert back["loss"] == pytest.approx(1.5)
    with pytest.raises(ValueError):          # NaN is refused rather than written as invalid JSON
        scores.write_results(tmp_path / "run", {"loss": float("nan")})
    assert json.loads(path.read_text())["step"] == 7    # the old file is intact


def test_markdown_lists_the_metrics_present():
    text = scores.markdown(_results(300, 2.0, bleu=27.31))
    assert "| BLEU (sacrebleu 13a) | 27.31 |" in text
    assert "| loss (nats/token) | 2 |" in text
    assert "| neg. log perplexity (Switch paper) | -2 |" in text
    assert "token accuracy" not in text                   # only where the run measured it
    assert "| token accuracy | 0.61 |" in scores.markdown(_results(300, 2.0, accuracy=0.61))
    assert "| word perplexity | 12.18 |" in text          # exp(200 / 80)
    assert "mean of 2 Switch layers) | 0.03 |" in text
    assert "1/4 = 0.25) | 0.2 / 0.3 |" in text
    dense = scores.markdown(_results(300, 2.0, dropped=(), load=()))
    assert "dropped" not in dense and "expert load" not in dense and "BLEU" not in dense


# -------------------------------------------------------------------------------- tables
def _run(root, name, model, step, results=None, seed=0, data=None, config=None, **moe):
    d = root / name
    d.mkdir()
    moe = {"train_capacity_factor": None, "eval_capacity_factor": None, "top_k": None, **moe}
    (d / "config.json").write_text(json.dumps({"model": model, "moe": moe, "data": data or {},
                                               "seed": seed, **(config or {})}))
    if results is not None:
        scores.write_results(d, results)
    return str(d)


def _row(text, label):
    return next(line for line in text.splitlines() if line.startswith(f"| {label} |"))


def test_collect_puts_published_and_ours_in_the_right_rows(tmp_path):
    runs = [
        _run(tmp_path, "t5", "t5_base", 100, _results(100, 1.80)),
        # null capacity factor = switch_base_128's catalogue default, 1.25
        _run(tmp_path, "sw125", "switch_base_128", 100, _results(100, 1.60), top_k=1),
        _run(tmp_path, "sw1_early", "switch_base_128", 50, _results(50, 1.70), top_k=1,
             train_capacity_factor=1.0),
        _run(tmp_path, "sw1_late", "switch_base_128", 100, _results(100, 1.55), top_k=1,
             train_capacity_factor=1),
        _run(tmp_path, "moe2", "switch_base_128", 100, _results(100, 1.58), top_k=2,
             train_capacity_factor=2.0),
        _run(tmp_path, "other", "switch_tiny", 10, _results(10, 3.0)),
    ]
    text = tables.collect("switch_table1", runs)
    assert _row(text, "T5-Base").split(" | ")[1:6] == ["—", "-1.731", "not achieved", "1600",
                                                      "-1.8"]
    assert "| 1.25 | -1.553 | 65.0 | 910 | -1.6 | 0.03 | 100 |" in _row(text, "Switch-Base 1.25")
    row = _row(text, "Switch-Base 1.0")
    assert "-1.561" in row and "-1.55 |" in row and "sw1_late" in row
    assert "-1.547" in _row(text, "MoE-Base (top-2) 2.0") and "moe2" in _row(
        text, "MoE-Base (top-2) 2.0")
    assert _row(text, "Switch-Base 2.0").endswith("| — | — | — | — |")
    assert _row(text, "Switch-Base+ 1.0").endswith("no catalogue model |")
    assert "Switch-Base 1.0: 2 runs match; shown:" in text and "sw1_early (step 50)" in text
    unmatched = text.split("Unmatched runs:")[1]
    assert "other" in unmatched and "switch_tiny" in unmatched and "sw125" not in unmatched
    assert "[holds] Switch-Base beats MoE-Base at capacity 1.25" not in text   # no MoE 1.25 run
    assert "[untested] Switch-Base beats MoE-Base at capacity 1.25" in text


def test_check_ordering_on_the_mini_table(tmp_path):
    # neg_log_perplexity = -loss: higher is better
    dense = _run(tmp_path, "dense", "dense_lm_cpu", 200, _results(200, 2.5))
    sw = [_run(tmp_path, f"sw{cf}", "switch_lm_cpu_8", 200, _results(200, loss), top_k=1,
               train_capacity_factor=cf) for cf, loss in ((1.0, 2.3), (1.25, 2.2), (2.0, 2.6))]
    top2 = _run(tmp_path, "top2", "switch_lm_cpu_8", 200, _results(200, 2.4), top_k=2,
                train_capacity_factor=1.0)
    checks = {c["claim"]: c for c in tables.check_ordering("switch_table1_mini",
                                                            [dense, top2] + sw)}
    sparse = next(c for claim, c in checks.items() if claim.startswith("Switch at every"))
    assert sparse["holds"] is False and "2.6" in sparse["detail"]     # cf 2.0 lost to dense
    assert sparse["margin"] == pytest.approx(-0.1)                    # -2.6 - (-2.5)
    assert checks["Switch (top-1) beats top-2 MoE at capacity 1.0"]["holds"] is True
    assert checks["Switch (top-1) beats top-2 MoE at capacity 1.0"]["margin"] == pytest.approx(0.1)
    untested = tables.check_ordering("switch_table1_mini", [dense])
    assert [c["holds"] for c in untested] == [None] * 4
    assert [c["margin"] for c in untested] == [None] * 4
    text = tables.collect("switch_table1_mini", [dense] + sw)
    assert "| -1.731 |" in text and "| -1.561 |" in text        # the paper's rows beside ours


def test_ordering_margins_take_the_smallest_gap_in_the_metric_direction(tmp_path):
    # Switch Table 1 mini, one seed per row: neg_log_perplexity = -loss, higher is better.
    losses = {(1, 1.0): 2.3, (1, 1.25): 2.2, (1, 2.0): 2.4, (2, 1.0): 2.35, (2, 1.25): 2.1,
              (2, 2.0): 2.45}
    runs = [_run(tmp_path, "dense", "dense_lm_cpu", 200, _results(200, 2.5))] + [
        _run(tmp_path, f"k{k}_cf{cf}", "switch_lm_cpu_8", 200, _results(200, loss), top_k=k,
             train_capacity_factor=cf) for (k, cf), loss in losses.items()]
    sparse, cf1, cf125, cf2 = tables.check_ordering("switch_table1_mini", runs)
    # the closest Switch (cf 2.0, loss 2.4) sets the margin over dense (2.5): +0.1, not +0.3
    assert (sparse["holds"], sparse["margin"]) == (True, pytest.approx(0.1))
    assert (cf1["holds"], cf1["margin"]) == (True, pytest.approx(0.05))
    assert (cf125["holds"], cf125["margin"]) == (False, pytest.approx(-0.1))
    # at capacity 2.0 the paper's ordering turns round: top-2 (2.45) should beat top-1 (2.4)
    assert cf2["claim"].startswith("top-2 MoE beats")
    assert (cf2["holds"], cf2["margin"]) == (False, pytest.approx(-0.05))
    # one seed per row, seed 0 in each: no seed spread anywhere in the table, no noise verdict
    assert all(c["seeds"] == [0] and c["noise"] is None and c["within_noise"] is None
               for c in (sparse, cf1, cf125, cf2))
    text = tables.collect("switch_table1_mini", runs)
    assert ("- [holds] Switch at every capacity factor reaches lower loss than dense at equal "
            "steps (margin +0.1; seed 0; no noise estimate: one seed per row; "
            "neg_log_perplexity: ") in text
    assert "- [FAILS] Switch (top-1) beats top-2 MoE at capacity 1.25 (margin -0.1; seed 0; " \
           in text
    assert "seeds (spread" not in text                  # no seeds column without seed groups
    # word perplexity: lower is better, so the margin is worse - better
    ppl = {1: 100.0, 2: 90.0, 4: 85.0, 8: 86.0}
    lm = [_run(tmp_path, f"h{h}", f"mtf_lm_cpu_h{h}", 50, _results(50, 3.0, word_perplexity=p))
          for h, p in ppl.items()]
    assert [(c["holds"], round(c["margin"], 9)) for c in tables.check_ordering(
        "mtf_table2_lm1b_mini", lm)] == [(True, 10.0), (True, 5.0), (False, -1.0)]


def test_runs_differing_only_by_seed_are_averaged_with_their_spread(tmp_path):
    vocab = tmp_path / "dense_s0" / "tokenizer.model"        # the first run trains the vocabulary
    # dense: seeds 0 and 1, the same vocabulary (one trained it, the other read it; compared by
    # content) and a different eval interval (bookkeeping): one row, the mean, spread 0.07
    d0 = _run(tmp_path, "dense_s0", "dense_lm_cpu", 200, _results(200, 2.50),
              data={"vocab_path": ""}, config={"eval_every_steps": 100})
    vocab.write_bytes(b"the vocabulary")
    d1 = _run(tmp_path, "dense_s1", "dense_lm_cpu", 200, _results(200, 2.57), seed=1,
              data={"vocab_path": str(vocab)}, config={"eval_every_steps": 50})
    # another vocabulary is another setup, not a seed: not averaged
    other = tmp_path / "other.model"
    other.write_bytes(b"another vocabulary")
    d2 = _run(tmp_path, "dense_s2_vocab", "dense_lm_cpu", 200, _results(200, 9.0), seed=2,
              data={"vocab_path": str(other)})
    # switch_8: seeds 0 and 1 (spread 0.06, mean 2.43); seed 2 stopped early (step 100) and a
    # duplicate of seed 0 are not shown; null overrides = the catalogue's top-1 at 1.25
    s0 = _run(tmp_path, "sw8_s0", "switch_lm_cpu_8", 200, _results(200, 2.40))
    s1 = _run(tmp_path, "sw8_s1", "switch_lm_cpu_8", 200, _results(200, 2.46), seed=1,
              top_k=1, train_capacity_factor=1.25)
    s2 = _run(tmp_path, "sw8_s2_early", "switch_lm_cpu_8", 100, _results(100, 2.0), seed=2)
    s0b = _run(tmp_path, "sw8_s0_again", "switch_lm_cpu_8", 200, _results(200, 2.0))
    s16 = _run(tmp_path, "sw16", "switch_lm_cpu_16", 200, _results(200, 2.41))
    s32 = _run(tmp_path, "sw32", "switch_lm_cpu_32", 200, _results(200, 2.30))
    runs = [d0, d1, d2, s0, s1, s2, s0b, s16, s32]
    eight, sixteen, thirty_two = tables.check_ordering("switch_figure4_mini", runs)
    # The noise rule (switchzoo.noise), like for like; neg_log_perplexity = -loss, higher better.
    # 8 vs dense, paired over seeds 0 and 1: gaps 2.50 - 2.40 = 0.10 and 2.57 - 2.46 = 0.11,
    # margin 0.105; sd of the gaps 0.0071, so a paired t-test's 95% half-width at 1 degree of
    # freedom is 12.71 x 0.0071 / sqrt(2) = 0.0635: 1.7x, beyond noise. (Two unpaired means
    # against the larger row spread, an older rule, read 0.105 < 2 x 0.07: within.)
    assert eight["holds"] is True and eight["margin"] == pytest.approx(0.105)
    assert eight["within_noise"] is False
    assert (eight["seeds"], eight["noise_from"]) == ([0, 1], "paired")
    assert eight["noise"] == pytest.approx(0.0635) and eight["ratio"] == pytest.approx(1.7)
    assert eight["df"] == 1
    assert "dense_lm_cpu (dense): -2.535 (mean of 2 seeds)" in eight["detail"]
    # 16 vs 8: seed 0 against seed 0 (not against 8's two-seed mean, 2.43, which read +0.02):
    # 2.40 - 2.41 = -0.01, 16 is behind; one common seed, so the noise comes from the reference,
    # the table's largest one-row seed sd: dense's 0.0495 (switch_8's is 0.0424), 1 degree of
    # freedom: 12.71 x sqrt(2) x 0.0495 = 0.8894
    assert sixteen["holds"] is False and sixteen["margin"] == pytest.approx(-0.01)
    assert sixteen["within_noise"] is True
    assert (sixteen["seeds"], sixteen["noise_from"]) == ([0], "reference")
    assert sixteen["noise"] == pytest.approx(0.8894)
    # 32 vs 16: one seed each, 2.41 - 2.30 = 0.11 < 0.8894: within noise
    assert thirty_two["margin"] == pytest.approx(0.11) and thirty_two["holds"] is True
    assert thirty_two["within_noise"] is True and thirty_two["noise"] == pytest.approx(0.8894)
    assert thirty_two["ratio"] == pytest.approx(0.1)

    text = tables.collect("switch_figure4_mini", runs)
    dense_row = _row(text, "dense_lm_cpu (dense)")
    assert "| -2.535 |" in dense_row and "| 0, 1 (0.07) |" in dense_row
    assert dense_row.endswith(f"| {d0}, {d1} |")
    row8 = _row(text, "switch_lm_cpu_8")
    assert "| -2.43 |" in row8 and "| 0, 1 (0.06) |" in row8 and "| 200 |" in row8
    assert _row(text, "switch_lm_cpu_32").endswith(f"| 0 | {s32} |")
    assert ("- [holds, beyond noise] 8 experts beat dense at equal FLOPs per token (margin "
            "+0.105; seeds 0, 1; noise 0.0635 (95%, paired t over the same-seed gaps, 1 df), "
            "1.7x; "
            "neg_log_perplexity: ") in text
    assert ("- [FAILS, within noise] 16 experts beat 8 (margin -0.01; seed 0; noise 0.8894 (95%, "
            "from the largest seed sd of one row, 1 df), 0.0x; ") in text
    assert "- [holds, within noise] 32 experts beat 16 (margin +0.11; seed 0; noise 0.8894 " in text
    notes = text.split("Notes:")[1]
    assert f"the mean of {s0}, {s1} (seeds 0, 1; step 200, the latest)" in notes
    assert f"{s2} (step 100)" in notes and f"{s0b} (step 200; seed 0 again)" in notes
    assert f"{d2} (step 200; differs in vocabulary)" in notes

    # One common seed beyond the reference: seed 0's gap 2.50 - 1.5 = 1.0 (not 1.035, against
    # dense's mean), 1.1x the 0.8894 of dense's sd. One seed per row keeps today's table (no
    # seeds column, the latest step wins) and has no noise estimate.
    far = _run(tmp_path, "sw8_far", "switch_lm_cpu_8", 300, _results(300, 1.5))
    check = tables.check_ordering("switch_figure4_mini", [d0, d1, far])[0]
    assert check["margin"] == pytest.approx(1.0) and check["within_noise"] is False
    assert "- [holds, beyond noise] 8 experts beat dense at equal FLOPs per token (margin +1; " \
           "seed 0; noise 0.8894 (95%, from the largest seed sd of one row, 1 df), 1.1x; " in \
           tables.collect(
               "switch_figure4_mini", [d0, d1, far])
    single = tables.collect("switch_figure4_mini", [d0, far, s0])
    assert "seeds (spread" not in single and _row(single, "switch_lm_cpu_8").endswith(
        f"| 300 | {far} |")
    # rows with no seed in common are not compared
    apart = tables.check_ordering("switch_figure4_mini", [d1, far])[0]
    assert apart["holds"] is None and "no seed in common" in apart["detail"]


def test_an_ordering_over_several_rows_is_beyond_noise_only_if_every_pair_is(tmp_path):
    # Switch Table 1 mini, "Switch at every capacity factor beats dense", every row seeds 0 and
    # 1 (losses; neg_log_perplexity = -loss). Same-seed gaps to dense (2.50, 2.56):
    #   cf 1.0:  2.37, 2.42 -> 0.13, 0.14: margin 0.135, noise 0.0635 -> beyond (2.1x)
    #   cf 1.25: 2.36, 2.30 -> 0.14, 0.26: margin 0.20,  noise 0.7624 -> within (0.3x)
    #   cf 2.0:  2.25, 2.29 -> 0.25, 0.27: margin 0.26,  noise 0.1271 -> beyond (2.0x)
    # (noise: a paired t-test's 95% half-width, 12.71 x sd(gaps) / sqrt(2) at 1 df)
    # The claim holds by 0.135 (the smallest margin) but within noise: cf 1.25's pair decides.
    # (The rule before: row means, 0.135 against 2 x 0.06, the largest row spread: beyond.)
    losses = {"dense": (2.50, 2.56), 1.0: (2.37, 2.42), 1.25: (2.36, 2.30), 2.0: (2.25, 2.29)}
    runs = []
    for cf, pair in losses.items():
        for seed, loss in enumerate(pair):
            model = "dense_lm_cpu" if cf == "dense" else "switch_lm_cpu_8"
            moe = {} if cf == "dense" else {"top_k": 1, "train_capacity_factor": cf}
            runs.append(_run(tmp_path, f"{cf}_s{seed}", model, 200, _results(200, loss),
                             seed=seed, **moe))
    sparse = tables.check_ordering("switch_table1_mini", runs)[0]
    assert sparse["holds"] is True and sparse["margin"] == pytest.approx(0.135)
    assert sparse["within_noise"] is True
    assert sparse["compared"] == ["switch_lm_cpu_8 top-1 1.25", "dense_lm_cpu (dense)"]
    assert sparse["pair_margin"] == pytest.approx(0.20)
    assert sparse["noise"] == pytest.approx(0.7624) and sparse["ratio"] == pytest.approx(0.3)
    assert ("- [holds, within noise] Switch at every capacity factor reaches lower loss than "
            "dense at equal steps (margin +0.135; judged on switch_lm_cpu_8 top-1 1.25 vs "
            "dense_lm_cpu (dense), +0.2 over seeds 0, 1; noise 0.7624 (95%, paired t over the "
            "same-seed gaps, 1 df), 0.3x; ") in tables.collect("switch_table1_mini", runs)
