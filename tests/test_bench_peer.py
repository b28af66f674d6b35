"""bench/peer.py at toy sizes: both sides run the same weights (logits agree) and the JSON
object carries both ratios. Timings are not checked (the machine is shared)."""
import math
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"
TINY = ["--batch", "2", "--length", "8", "--new-tokens", "3", "--vocab", "64", "--d-model", "16",
        "--d-ff", "32", "--d-kv", "8", "--heads", "2", "--layers", "2", "--experts", "4",
        "--repeats", "1", "--warmup", "1"]


@pytest.fixture(scope="module")
def peer():
    sys.path.insert(0, str(BENCH))
    try:
        import peer
        yield peer
    finally:
        sys.path.remove(str(BENCH))


def test_peer_bench_compares_the_same_computation(peer, tmp_path):
    result = peer.main(TINY + ["--out", str(tmp_path / "peer.json")])
    assert (tmp_path / "peer.json").is_file()
    check = result["correctness"]
    assert check["max_abs_logit_diff"] < 1e-3 and check["ok"]
    assert check["same_parameter_count"] and check["greedy_tokens_equal"]
    ce = check["first_step_cross_entropy"]
    assert abs(ce["switchzoo"] - ce["transformers"]) < 1e-3
    for name, goal in (("train", 1.5), ("decode", 3.0)):
        ratio = result["goals"][f"{name}_tokens_per_s_over_transformers"]
        assert ratio["value"] > 0 and math.isfinite(ratio["value"])
        assert ratio["goal"] == f">= {goal}" and ratio["met"] == (ratio["value"] >= goal)
    for side in ("switchzoo", "transformers"):
        assert result[side]["train_tokens_per_s"] > 0 and result[side]["decode_tokens_per_s"] > 0
    config = result["config"]
    assert (config["batch"], config["length"], config["new_tokens"]) == (2, 8, 3)
    assert config["expert_capacity"] == math.ceil(1.25 * 8 / 4)
    assert result["threads"] >= 1
