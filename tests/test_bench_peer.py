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


@pytest.fixture(scope="module")
def result(peer, tmp_path_factory):
    out = tmp_path_factory.mktemp("peer") / "peer.json"
    result = peer.main(TINY + ["--out", str(out)])
    assert out.is_file()
    return result


def test_peer_bench_compares_the_same_computation(result):
    check = result["correctness"]
    assert check["max_abs_logit_diff"] < 1e-3 and check["ok"]
    assert check["same_parameter_count"] and check["greedy_tokens_equal"]
    ce = check["first_step_cross_entropy"]
    assert abs(ce["switchzoo"] - ce["transformers"]) < 1e-3
    for name, goal in (("train", 1.2), ("decode", 3.0)):      # issue 67's goals
        ratio = result["goals"][f"{name}_tokens_per_s_over_transformers"]
        assert ratio["value"] > 0 and math.isfinite(ratio["value"])
        assert ratio["goal"] == f">= {goal}" and ratio["met"] == (ratio["value"] >= goal)
    for side in ("switchzoo", "transformers"):
        assert result[side]["train_tokens_per_s"] > 0 and result[side]["decode_tokens_per_s"] > 0
    config = result["config"]
    assert (config["batch"], config["length"], config["new_tokens"]) == (2, 8, 3)
    assert config["expert_capacity"] == math.ceil(1.25 * 8 / 4)
    assert result["threads"] >= 1
    commit = result["machine"]["commit"]          # None outside a git checkout
    assert commit is None or (len(commit) == 40 and result["machine"]["tree_clean"] in (
        True, False))


def test_series_medians_and_report(peer, result):
    """bench/peer_series.py's summary of runs (copies of the real run with other ratios and
    thread counts): median, min and max per thread setting, goals judged on the median, and
    report.py's table of it."""
    import copy

    import peer_series
    import report
    runs = []
    for threads, ratios in ((2, (0.9, 1.2, 0.8)), (1, (0.7, 0.75, 0.72))):
        for value in ratios:
            run = copy.deepcopy(result)
            run["threads"] = threads
            run["goals"]["train_tokens_per_s_over_transformers"]["value"] = value
            runs.append(run)
    by = peer_series.summarise(runs)
    assert list(by) == ["2", "1"]
    assert by["2"]["train_tokens_per_s_over_transformers"] == {
        "median": 0.9, "min": 0.8, "max": 1.2, "runs": [0.9, 1.2, 0.8]}
    assert by["1"]["train_tokens_per_s_over_transformers"]["median"] == 0.72
    goals = peer_series.goals(by)
    assert goals["train_tokens_per_s_over_transformers_2_threads_median"] == {
        "value": 0.9, "goal": ">= 1.2", "met": False}
    series = {"config": result["config"], "runs": runs, "by_threads": by, "env": {},
              "source": {"commit": "abcdef0123", "tree_clean": True}}
    table = "\n".join(report.peer_section(series, None))
    assert "**0.9** (0.8-1.2)" in table and "**0.72** (0.7-0.75)" in table
    assert "`abcdef0`" in table and "agree in every run: True" in table


def test_step_profile_attributes_every_op(peer):
    """bench/step_profile.py at toy size: both sides profiled, switchzoo's ops attributed to
    the model's named scopes, each side's rows summing to its op time."""
    import op_kinds
    import step_profile
    r = step_profile.main(TINY + ["--steps", "2"])
    ours, theirs = r["switchzoo"], r["transformers"]
    parts = {row["part"] for row in ours["rows"]}
    assert {"attention", "experts", "routing", "optimizer", "logits", "loss"} <= parts
    phases = {row["phase"] for row in ours["rows"]}
    assert {"forward", "backward", "update"} <= phases
    for side in (ours, theirs):
        assert side["step_ms"] > 0 and side["ops_per_step"] > 0
        assert abs(sum(row["ms"] for row in side["rows"]) - side["ops_ms"]) < 0.1 + 0.01 * len(
            side["rows"])
    assert {"matmul", "optimizer"} <= {row["kind"] for row in theirs["rows"]}
    # One thread runs the ops one after another: a loop's or branch's own event, which spans
    # its body's (traced too), is not counted again, so the ops fit in the step.
    assert ours["containers_ms"] > 0 and ours["ops_ms"] <= 1.05 * ours["step_ms"] + 0.5
    assert "| **step** |" in r["table"]
    hlo = ("  %while.2 = (s32[], f32[2]{0}, /*index=2*/f32[3]) while(%t), condition=%c, body=%b\n"
           "  %cond.1 = (f32[2]) conditional(%p, %x), branch_computations={%a, %b}\n"
           '  ROOT %fusion.3 = bf16[8]{0:T(8)} fusion(%x), metadata={op_name="jit(f)/add"}\n')
    assert op_kinds.hlo_ops(hlo) == {"while.2": ("while", "", False),
                                     "cond.1": ("conditional", "", False),
                                     "fusion.3": ("fusion", "jit(f)/add", False)}
    assert op_kinds.classify("x", ("fusion", "jit(f)/transpose(jvp(experts))/dot", True)) \
        == ("backward", "experts", "matmul")
    assert op_kinds.classify("copy.3", ("copy", "jit(f)/jvp(attention)/t", False)) \
        == ("forward", "attention", "copy/layout")
    assert op_kinds.classify("copy_bitcast_fusion.2", ("fusion", "state.params['q']",
                                                           False))[:2] == ("forward",
                                                                           "weight layout")


def test_cpu_micro_times_each_pair_on_the_peer_sizes(peer):
    """bench/cpu_micro.py at toy size: each pair of ways is timed, first_max agrees with
    argmax (checked inside), AdamW runs over the peer model's weight shapes."""
    import cpu_micro
    r = cpu_micro.main(["--threads", "1", "--vocab", "64", "--d-model", "16", "--d-ff", "32",
                        "--d-kv", "8", "--heads", "2", "--layers", "2", "--experts", "4"])
    # the weights of the transformers model at those sizes (its experts one matrix each; not
    # its routers, relative-position tables or norms)
    import transformers
    args = peer.build_parser().parse_args(TINY)
    model = transformers.SwitchTransformersForConditionalGeneration(peer.hf_config(args))
    matrices = {id(p): p.numel() for name, p in model.named_parameters()
                if p.ndim >= 2 and "router" not in name and "relative_attention" not in name}
    assert r["adamw"]["parameters"] == sum(matrices.values())
    assert r["adamw"]["leaves"] == len(cpu_micro.peer_shapes(args))
    assert r["greedy_token"]["shape"] == [8, 64]
    for value in (*r["greedy_token"].values(), *r["adamw"].values(),
                  *r["qkv_in_a_decoding_loop"].values()):
        assert not isinstance(value, float) or value > 0
