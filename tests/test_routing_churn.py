"""experiments/routing_churn.py: its churn statistic on choices with known answers, its capture
of an encoder-decoder's routing (each stack's valid positions, attributed to the right stack),
and its one-line errors."""
import json
import pathlib
import sys

import numpy as np
import pytest
from flax import nnx

from switchzoo import transformer, zoo

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "experiments"))

import routing_churn as churn  # noqa: E402


def test_churn_known_answers():
    first = np.array([0, 0, 1, 1, 2, 3, 3, 3])
    out = churn.churn(first, first, 4)
    assert out["changed"] == 0.0 and out["tokens"] == 8
    assert out["load_1"] == out["load_2"] == [0.25, 0.25, 0.125, 0.375]
    assert out["chance"] == pytest.approx(1 - (2 * 0.0625 + 0.015625 + 0.140625), abs=1e-4)
    second = np.array([1, 0, 1, 1, 2, 3, 0, 3])                 # 2 of 8 move
    out = churn.churn(first, second, 4)
    assert out["changed"] == 0.25 and out["load_2"] == [0.25, 0.375, 0.125, 0.25]
    # one expert takes everything at both steps: nothing can change, and chance says so
    assert churn.churn(np.zeros(5, int), np.zeros(5, int), 4)["chance"] == 0.0


def test_capture_attributes_each_switch_layer_to_its_stack():
    cfg = zoo.get("switch_base_tiny").replace(scan_layers=False)    # 2+2 layers, layer 1 sparse
    rng = np.random.default_rng(0)
    B, Li, Lt = 4, 16, 6
    in_len, out_len = np.array([16, 9, 4, 12]), np.array([6, 3, 5, 1])
    segs = [(np.arange(L) < n[:, None]).astype(np.int32) for L, n in ((Li, in_len),
                                                                       (Lt, out_len))]
    batch = {"inputs": rng.integers(3, cfg.vocab_size, (B, Li)).astype(np.int32) * segs[0],
             "targets": rng.integers(3, cfg.vocab_size, (B, Lt)).astype(np.int32) * segs[1],
             "inputs_segments": segs[0], "targets_segments": segs[1],
             "inputs_positions": np.where(segs[0] > 0, np.arange(Li), 0),
             "targets_positions": np.where(segs[1] > 0, np.arange(Lt), 0)}
    model = transformer.build(cfg, 0)
    got = churn.capture(model, cfg, None, batch)
    assert [s for s, _ in got] == ["encoder", "decoder"]
    assert [len(e) for _, e in got] == [in_len.sum(), out_len.sum()]      # padding left out
    assert all(((e >= 0) & (e < cfg.moe.num_experts)).all() for _, e in got)
    again = churn.capture(model, cfg, None, batch)
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(got, again))
    # the decoder's router reversed: its choices move, the encoder's (which never sees the
    # decoder) do not
    graphdef, state = nnx.split(model)
    pure = nnx.to_pure_dict(state)
    router = pure["decoder"]["layers"][1]["ffn"]["router"]
    router["w"] = -router["w"]
    nnx.replace_by_pure_dict(state, pure)
    moved = churn.capture(nnx.merge(graphdef, state), cfg, None, batch)
    (_, enc), (_, dec) = got
    assert np.array_equal(moved[0][1], enc)
    assert churn.churn(dec, moved[1][1], cfg.moe.num_experts)["changed"] > 0.3


def test_errors_are_one_line(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "eval.txt").write_text("one text\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model": "switch_base_tiny"}))
    for args, words in ((["--workdir", str(tmp_path / "missing")], "no config.json"),
                        (["--workdir", str(run), "--examples", "0"], "positive count"),
                        (["--workdir", str(run), "--steps", "12", "11"], "earlier step first"),
                        (["--workdir", str(run)], "keeps 0 checkpoint")):
        code = churn.main([*args, "--corpus", str(corpus), "--json", str(tmp_path / "o.json")])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith("error: ") and words in err and "\n" not in err, err
    assert not (tmp_path / "o.json").exists()
