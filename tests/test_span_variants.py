"""experiments/span_effects.py's readers of the long pair's variants (unit gates, expert
momentum, fewer experts, frozen routers, bias balancing), each judged against Switch-8 and dense
of its seed under the noise rule, and the variants' plot panels."""
import pytest

from test_span_claims import (LONG, beside_the_pair, harness, span_claims, span_effects,
                              span_runs)
from test_study_arithmetic import summary


def test_the_unit_gate_runs_hold_the_gate_at_one_and_are_judged_against_switch_and_dense():
    """GATE is no-jitter Switch-8 at 0.04 with the renormalised top-1 gate (value 1) trained
    straight through on every step; gate_effects pairs it by seed with that Switch-8 and with
    dense at their evaluations."""
    gate = {r.seed: r for r in span_runs.GATE}
    for seed, run in gate.items():
        assert run.flags[:2] == span_runs.rated(0.04, seed)[1].flags and run.steps == 12000
        assert {"--config.moe.gates_sum_to_one=true",
                "--config.moe.straight_through_steps=-1"} <= set(run.flags)
    runs = beside_the_pair(gate.get, {0: [3.35, 2.78], 1: [3.40, 2.75]})
    out = span_effects.gate_effects({"runs": runs})
    assert out["at_step"] == 12000
    assert out["by_seed"][1]["switch_8_unitgate_minus_dense"] == [
        pytest.approx(-0.06), pytest.approx(0.06)]
    c = out["unit_gate_better_than_switch"]
    assert c["runs"] == ["switch_8_unitgate_lr0.04", "switch_8_nojitter_lr0.04"]
    assert c["gaps"] == [pytest.approx(0.06), pytest.approx(0.07)]
    assert c["verdict"] == "better, beyond noise"
    assert out["unit_gate_better_than_dense"]["verdict"] == "worse, beyond noise"


def test_the_expert_momentum_runs_change_only_the_experts_optimizer_and_are_judged():
    """MOMENTUM is no-jitter Switch-8 at 0.04 with --config.expert_momentum, the long pair's
    steps; momentum_effects pairs it by seed with that Switch-8 and with dense."""
    for run in span_runs.MOMENTUM:
        switch = span_runs.rated(0.04, run.seed)[1]
        assert run.flags == switch.flags + (
            f"--config.expert_momentum={span_runs.EXPERT_MOMENTUM:g}",)
        assert run.steps == 12000 and run.baseline == span_runs.rated(0.04, run.seed)[0].name
    runs = beside_the_pair(span_runs.averaged, {0: [3.31, 2.70], 1: [3.40, 2.67]})
    out = span_effects.momentum_effects({"runs": runs})
    c = out["expert_momentum_better_than_dense"]
    assert c["runs"] == ["switch_8_expmom_lr0.04", "dense_lr0.04"]
    assert c["gaps"] == [pytest.approx(0.02), pytest.approx(0.02)]
    assert c["verdict"] == "better, beyond noise"
    assert out["expert_momentum_better_than_switch"]["verdict"] == "better, beyond noise"
    assert "dense_momentum" not in out                  # its dense control did not run
    for run in span_runs.DENSE_MOMENTUM:              # the control: dense, every update
        dense = span_runs.rated(0.04, run.seed)[0]
        assert run.flags == dense.flags + (
            f"--config.momentum={span_runs.EXPERT_MOMENTUM:g}",) and run.baseline == dense.name
    control = span_runs.DENSE_MOMENTUM[0]
    runs[control.name] = summary(LONG, [3.28, 2.73], seed=0, model=control.model,
                                 flags=control.flags)
    c = span_effects.momentum_effects({"runs": runs})["dense_momentum"]
    assert c["by_seed"][0]["dense_mom_minus_dense"] == [pytest.approx(-0.02), pytest.approx(0.01)]
    assert c["dense_momentum_better_than_dense"]["runs"] == ["dense_mom_lr0.04", "dense_lr0.04"]
    assert c["dense_momentum_better_than_dense"]["seeds"] == [0]


def test_switch_with_fewer_experts_changes_only_the_model_and_is_judged_per_expert_count():
    """FEWER is the no-jitter Switch at 0.04 with 2 or 4 experts at the same FLOPs, the long
    pair's steps; experts_effects judges each count against Switch-8 and dense of its seed."""
    from switchzoo import zoo
    for run in span_runs.FEWER:
        dense, switch = span_runs.rated(0.04, run.seed)
        assert run.flags == switch.flags and run.steps == 12000 and run.baseline == dense.name
        e = zoo.get(run.model).moe.num_experts
        assert run.name == harness.seeded_name(f"switch_{e}_nojitter_lr0.04", run.seed)
        assert zoo.flops_per_token(run.model) == pytest.approx(
            zoo.flops_per_token(switch.model), rel=1e-3)
    assert {zoo.get(r.model).moe.num_experts for r in span_runs.FEWER} == {2, 4}
    runs = beside_the_pair(lambda seed: span_runs.fewer(2, seed),
                           {0: [3.31, 2.73], 1: [3.40, 2.71]})
    out = span_effects.experts_effects({"runs": runs})
    assert set(out) == {"2_experts"}                     # the 4-expert runs did not run
    two = out["2_experts"]
    assert two["by_seed"][1]["switch_2_minus_dense"] == [pytest.approx(-0.06), pytest.approx(0.02)]
    c = two["switch_2_better_than_switch_8"]
    assert c["runs"] == ["switch_2_nojitter_lr0.04", "switch_8_nojitter_lr0.04"]
    assert c["verdict"] == "better, beyond noise"
    assert two["switch_2_better_than_dense"]["gaps"] == [pytest.approx(-0.01),
                                                         pytest.approx(-0.02)]


def test_the_frozen_router_runs_add_only_the_freeze_and_are_judged():
    """FROZEN is the no-jitter Switch-8 at 0.04 with --config.router_freeze_step=FREEZE_STEP for
    the long pair's steps; frozen_effects judges it against Switch-8 and dense of its seed."""
    assert [r.seed for r in span_runs.FROZEN] == [0, 1]
    for run in span_runs.FROZEN:
        dense, switch = span_runs.rated(0.04, run.seed)
        assert run.model == switch.model and run.steps == 12000 and run.baseline == dense.name
        assert run.flags == switch.flags + (
            f"--config.router_freeze_step={span_runs.FREEZE_STEP}",)
        assert 0 < span_runs.FREEZE_STEP < run.steps
    runs = beside_the_pair(span_runs.frozen, {0: [3.36, 2.70], 1: [3.41, 2.68]})
    out = span_effects.frozen_effects({"runs": runs})
    assert out["at_step"] == 12000
    assert out["by_seed"][0]["switch_8_frozen_minus_dense"] == [pytest.approx(0.06),
                                                                 pytest.approx(-0.02)]
    c = out["frozen_better_than_dense"]
    assert c["runs"] == ["switch_8_frozen4k_lr0.04", "dense_lr0.04"]
    assert c["gaps"] == [pytest.approx(0.02), pytest.approx(0.01)]
    assert out["frozen_better_than_switch"]["verdict"] == "better, beyond noise"
    del runs["switch_8_frozen4k_lr0.04_s1"]          # one seed: its reference spread, or none
    assert span_effects.frozen_effects({"runs": runs})["by_seed"].keys() == {0}


def test_the_bias_balanced_runs_drop_only_the_auxiliary_loss_and_are_judged():
    """BIAS is the no-jitter Switch-8 at 0.04 balanced by DeepSeek-V3's bias (no auxiliary loss)
    for the long pair's steps (that the step then trains without the loss:
    tests/test_routing_family.py); bias_effects judges it against Switch-8 and dense of its
    seed."""
    assert [r.seed for r in span_runs.BIAS] == [0, 1]
    for run in span_runs.BIAS:
        dense, switch = span_runs.rated(0.04, run.seed)
        assert run.model == switch.model and run.steps == 12000 and run.baseline == dense.name
        assert run.flags == switch.flags + ("--config.moe.balance=bias",)
    runs = beside_the_pair(span_runs.bias_balanced, {0: [3.40, 2.80], 1: [3.43, 2.79]})
    out = span_effects.bias_effects({"runs": runs})
    assert out["at_step"] == 12000
    assert out["by_seed"][1]["switch_8_bias_minus_dense"] == [pytest.approx(-0.03),
                                                              pytest.approx(0.10)]
    c = out["bias_better_than_switch"]
    assert c["runs"] == ["switch_8_bias_lr0.04", "switch_8_nojitter_lr0.04"]
    assert c["gaps"] == [pytest.approx(0.04), pytest.approx(0.03)]
    assert c["verdict"] == "better, within noise"        # 0.035 against 0.0635 (1 df)
    assert out["bias_better_than_dense"]["verdict"].startswith("worse")
    del runs["dense_lr0.04_s1"]                      # seed 1 without its dense: seed 0 alone
    assert span_effects.bias_effects({"runs": runs})["by_seed"].keys() == {0}


def test_a_variants_plot_panel_shows_it_beside_the_pair_of_its_own_seed_once():
    ran = ["dense_lr0.04", "switch_8_nojitter_lr0.04", "dense_lr0.04_s1",
           "switch_8_nojitter_lr0.04_s1", "switch_8_dec_nojitter_lr0.04_s1",
           "switch_8_enc_nojitter_lr0.04_s1", "switch_8_unitgate_lr0.04_s1"]
    result = {"runs": dict.fromkeys(ran, {})}
    pair = ["dense_lr0.04_s1", "switch_8_nojitter_lr0.04_s1"]
    assert span_claims.beside_the_pair(result, span_runs.ONE_STACK) == pair + [
        "switch_8_dec_nojitter_lr0.04_s1", "switch_8_enc_nojitter_lr0.04_s1"]
    assert span_claims.beside_the_pair(result, span_runs.GATE) == pair + [
        "switch_8_unitgate_lr0.04_s1"]
    assert span_claims.beside_the_pair(result, span_runs.WIDE) == []


def test_a_variant_judged_on_seed_1_alone_is_named_by_its_seed_1_runs():
    long = [2000, 12000]
    dense, switch = span_runs.rated(0.04, 1)
    gate = span_runs.GATE[1]
    runs = {r.name: summary(long, losses, seed=1, model=r.model, flags=r.flags)
            for r, losses in ((dense, [3.46, 2.69]), (switch, [3.42, 2.82]),
                              (gate, [3.40, 2.75]))}
    c = span_effects.gate_effects({"runs": runs})["unit_gate_better_than_switch"]
    assert c["runs"] == [gate.name, switch.name] and c["seeds"] == [1]
