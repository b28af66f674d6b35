"""experiments/specialisation.py: its statistics on assignments with known answers, its capture of
routing decisions on a tiny random Switch LM, and its one-line errors."""
import dataclasses
import json
import pathlib
import sys

import numpy as np
import pytest

from switchzoo import moe, routing, steps, transformer, zoo

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import specialisation as spec  # noqa: E402

E = 4


def stats(experts, ids, context=None, kept=None):
    n = len(experts)
    return spec.layer_stats({"expert": experts, "id": ids,
                             "context": ids if context is None else context,
                             "kept": np.ones(n, bool) if kept is None else kept,
                             "picks_kept": np.ones(n, int)}, E, 1)


def test_statistics_known_answers():
    rng = np.random.default_rng(0)
    ids = rng.permutation(np.repeat(np.arange(40), 25))       # 40 ids x 25, loads 1/4 each
    unrelated = rng.integers(0, 40, len(ids))
    kept = np.arange(len(ids)) % 10 != 0

    s = stats(ids % E, ids, unrelated, kept)                    # the id fixes the expert
    assert s["tokens"] == 1000 and s["ids_seen_5"] == 40 and s["dropped"] == pytest.approx(0.1)
    assert s["load"] == [0.25] * E
    assert s["determinism"]["value"] == 1.0 and s["nmi_token"]["value"] == pytest.approx(1.0)
    assert s["determinism"]["baseline"] < 0.5 and s["nmi_token"]["baseline"] < 0.2
    # the previous id says nothing here: its NMI is its shuffled baseline (plug-in bias alone)
    assert abs(s["nmi_context"]["value"] - s["nmi_context"]["baseline"]) < 0.03
    # every id of expert 0 is over-represented 4x (1 / its load): all of them and only them
    assert {p["piece"] for p in s["pieces"][0]} <= {str(i) for i in range(0, 40, E)}
    assert [p["ratio"] for p in s["pieces"][0]] == [4.0] * spec.PIECES

    s = stats(rng.integers(0, E, len(ids)), ids)                # blind to the id: chance
    for name in ("determinism", "nmi_token"):
        assert s[name]["value"] < 0.5
        assert abs(s[name]["value"] - s[name]["baseline"]) < 0.03, (name, s[name])


def test_nmi_and_determinism_worked_example():
    # id 0 (x6) always to expert 0; id 1 (x6) spread over experts 1, 2, 3. H(E) = (log 2 +
    # log 6) / 2, H(E|T) = (log 3) / 2, so I = log 2 and I / H(E) = log 4 / log 12; the share of
    # each id's occurrences at its top expert: (6 + 2) / 12.
    ids = np.repeat([0, 1], 6)
    experts = np.array([0] * 6 + [1, 2, 3] * 2)
    table = spec.contingency(experts, ids, E)[0]
    assert spec.nmi(table) == pytest.approx(np.log(4) / np.log(12))
    assert spec.determinism(table) == pytest.approx(2 / 3)
    assert spec.determinism(spec.contingency(experts[:10], ids[:10], E)[0]) == 1.0  # id 1 x4 < 5
    # an id seen once is no specialisation, however over-represented: pieces leave it out
    pieces = spec.top_pieces(np.append(experts, 3), np.append(ids, 9), E)
    assert [p["piece"] for p in pieces[3]] == ["1"] and [p["piece"] for p in pieces[0]] == ["0"]


def test_capture_tiny_model():
    cfg = zoo.get("switch_tiny")         # decoder-only; Switch layers 1 and 3, groups of 32
    model = transformer.build(cfg, 0)
    rng = np.random.default_rng(0)
    B, L = 4, 16                          # 64 tokens: 2 groups of 2 rows each
    lengths = np.array([16, 11, 5, 0])
    segments = (np.arange(L) < lengths[:, None]).astype(np.int32)
    batch = {"inputs": rng.integers(3, cfg.vocab_size, (B, L)).astype(np.int32) * segments,
             "segments": segments, "positions": np.where(segments > 0, np.arange(L), 0)}
    valid = segments > 0

    records = spec.capture(model, cfg, None, batch)
    assert moe.route is routing.route and moe.choose is routing.choose     # restored
    assert spec.switch_layers(cfg) == [1, 3] and len(records) == 2
    _, aux = steps.forward(model, cfg, None, batch)
    for j, rec in enumerate(records):
        assert rec["expert"].shape == (B, L)
        # one recorded choice per valid token, none for padding
        assert np.array_equal(rec["expert"] >= 0, valid)
        assert (rec["expert"] >= 0).sum() == valid.sum() == int(aux["routed_tokens"][j])
        # the same loads as the layer's own metric (first choices, before capacity)
        counts = np.bincount(rec["expert"][valid], minlength=cfg.moe.num_experts)
        np.testing.assert_allclose(counts / valid.sum(), np.asarray(aux["expert_load"][j]),
                                   atol=1e-6)
        assert not rec["kept"][~valid].any()

    # The map back to (batch, position): routing is causal, so new ids at row 0, positions
    # 8.. may change the choices there (and drops, hence later layers, in row 1, the rest of
    # the group), never at row 0's earlier positions or in the other group (rows 2, 3).
    changed = dict(batch, inputs=batch["inputs"].copy())
    changed["inputs"][0, 8:] = (changed["inputs"][0, 8:] + 7) % (cfg.vocab_size - 3) + 3
    again = spec.capture(model, cfg, None, changed)
    for rec, new in zip(records, again):
        diff = rec["expert"] != new["expert"]
        assert not diff[0, :8].any() and not diff[2:].any()
    assert (records[0]["expert"][0, 8:] != again[0]["expert"][0, 8:]).any()   # not vacuous


def test_errors_are_one_line(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "eval.txt").write_text("one text\n")
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({"model": "dense_tiny", "task": "lm", "max_length": 64,
                                                        "data": {"source": "files"}}))
    for workdir, words in ((tmp_path / "missing", "no config.json"),
                           (dense, "no Switch layer")):
        code = spec.main(["--workdir", str(workdir), "--corpus", str(corpus),
                          "--json", str(tmp_path / "out.json")])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith("error: ") and words in err and "\n" not in err
        assert "pass" in err                        # says what to do
    assert spec.main(["--workdir", str(dense), "--corpus", str(tmp_path / "none")]) == 2
    assert "eval.txt" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_capture_dropless_path():
    # moe.dispatch=dropless routes through moe.choose, not moe.route: recorded too, none dropped
    cfg = zoo.get("switch_tiny")
    cfg = cfg.replace(moe=dataclasses.replace(cfg.moe, dispatch="dropless"))
    segments = np.ones((2, 16), np.int32)
    batch = {"inputs": np.arange(3, 35, dtype=np.int32).reshape(2, 16), "segments": segments,
             "positions": np.broadcast_to(np.arange(16), (2, 16))}
    records = spec.capture(transformer.build(cfg, 0), cfg, None, batch)
    assert len(records) == 2 and moe.choose is routing.choose
    for rec in records:
        assert (rec["expert"] >= 0).all() and rec["kept"].all()
