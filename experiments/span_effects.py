"""Readers of experiments/span_claims.py's study: each turns the collected runs into one family's
effects (JSON-ready dicts keyed as docs/span_*.json holds them), judged under the study's noise
rule. ``effects(result)`` is every family at once; a family whose runs have not finished is {}.
"""
from __future__ import annotations

import harness
import verdicts
from span_runs import (
    BATCH, BATCH_SEEDS, BIAS, DENSE_MOMENTUM, FEWER, FEWER_EXPERTS, FROZEN, GATE, MOMENTUM,
    ONE_STACK, RATE_GRID, RATES, ROUTER, SCALED_RATE, STACKS, WIDE, WIDER, at_rate, batched, rated)
from switchzoo import noise


def effects(result: dict) -> dict:
    """Every family's reader on ``result`` (harness.collect's), under the keys the published
    JSON carries."""
    return {
        "router_effects": router_effects(result),
        "rate_effects": rate_effects(result),
        "stack_effects": stack_effects(result),
        "batch_effects": batch_effects(result),
        "batch_effects_long": batch_effects(result, 12000),
        f"batch_effects_long_lr{SCALED_RATE:g}": batch_effects(result, 12000, SCALED_RATE),
        "wide_effects": wide_effects(result),
        "gate_effects": gate_effects(result),
        "momentum_effects": momentum_effects(result),
        "experts_effects": experts_effects(result),
        "frozen_effects": frozen_effects(result),
        "bias_effects": bias_effects(result),
        # training against held-out loss at 0.04, each Switch run against dense of its seed:
        # does the model with the more parameters fit the text it has seen faster than the rest?
        "train_and_held_out": verdicts.train_and_held_out_pairs(result, [
            (r.name, r.baseline) for r in RATES + ONE_STACK
            if "--config.learning_rate=0.04" in r.flags and r.name != r.baseline]),
    }


def rate_effects(result: dict) -> dict:
    """At each rate of RATE_GRID that has finished runs (and at the recipe's 0.01, the runs
    dense and switch_8_nojitter): no-jitter Switch-8 against dense of the same rate under the
    noise rule, like for like over the seeds both ran (verdicts.compare), with the study's
    reference spread where only one seed ran."""
    runs = {n: r for n, r in result["runs"].items() if r["finished"]}
    finished = {**result, "runs": runs}
    out = {}
    for rate in (0.01, *RATE_GRID):
        dense, switch = at_rate("dense", rate), at_rate("switch_8_nojitter", rate)
        if dense in runs and switch in runs:
            out[f"{rate:g}"] = {"dense": verdicts.seeds(finished, dense),
                                "switch_8_nojitter": verdicts.seeds(finished, switch),
                                "switch_better": verdicts.compare(finished, switch, dense)}
    best = at_best_mean_rate(finished)
    if best:
        out["each_at_its_best"] = best
    return out


def at_best_mean_rate(result: dict) -> dict:
    """Each model at its best rate, then no-jitter Switch-8 there against dense there, paired
    by seed (verdicts.compare): the comparison at each model's own best rate when one seed's
    best rate is not another's. A model's best rate is the one whose mean final loss is
    lowest against every other rate over the seeds both ran (rates with two seeds or more;
    means over unlike seeds would mix a bad seed into one rate only)."""
    out = {"mean_by_rate": {}, "best_rate": {}}
    picked = {}
    for stem in ("dense", "switch_8_nojitter"):
        by_rate = {rate: verdicts.seeds(result, at_rate(stem, rate))
                   for rate in (0.01, *RATE_GRID)}
        by_rate = {r: v for r, v in by_rate.items() if len(v) >= 2}
        if not by_rate:
            return {}

        def mean(rate, seeds):
            return sum(by_rate[rate][s] for s in seeds) / len(seeds)

        def beats(r, q):
            common = sorted(set(by_rate[r]) & set(by_rate[q]))
            return not common or mean(r, common) <= mean(q, common)
        best = [r for r in by_rate if all(beats(r, q) for q in by_rate if q != r)]
        if not best:
            return {}
        out["mean_by_rate"][stem] = {f"{r:g}": {"mean": round(mean(r, sorted(v)), 4),
                                                "seeds": sorted(v)} for r, v in by_rate.items()}
        out["best_rate"][stem] = best[0]
        picked[stem] = at_rate(stem, best[0])
    out["switch_better"] = verdicts.compare(result, picked["switch_8_nojitter"], picked["dense"])
    return out


def stack_effects(result: dict) -> dict:
    """{"dec" / "enc": ...} for each one-stack Switch-8 (ONE_STACK) with a finished run of any
    seed: against dense and against the no-jitter Switch-8 of its rate, each like for like over
    the seeds both finished (verdicts.compare), with its final losses by seed and its one
    router's entropy over the last training interval."""
    runs = {n: r for n, r in result["runs"].items() if r["finished"]}
    finished = {**result, "runs": runs}
    out = {}
    for stack, model in STACKS.items():
        mine = [r.name for r in ONE_STACK if r.model == model and r.name in runs]
        if not mine:
            continue
        c = out[stack] = {"final_eval_loss": verdicts.seeds(finished, mine[0]),
                          "router_entropy_train": {n: runs[n].get("router_entropy_train")
                                                   for n in mine if n in runs}}
        for other in ("dense_lr0.04", "switch_8_nojitter_lr0.04"):
            if other in runs:
                c["against_" + other] = verdicts.compare(finished, mine[0], other)
    return out


def batch_effects(result: dict, budget: int = 2400, rate: float = 0.04) -> dict:
    """The ``rate`` pair at WIDER x the batch for the tokens of ``budget`` steps (BATCHED at
    2,400, BATCHED_LONG at 12,000; BATCHED_SCALED at SCALED_RATE) over the seeds where both
    finished: each one's final loss by seed, Switch minus dense of each seed there and at the
    study's batch at 0.04 (the same seed and tokens), each evaluation's gap beside the study
    batch's at the same tokens (keyed by its steps), and the verdict at the wider batch under
    the study's rule (paired by seed; with one seed, its reference spread)."""
    runs = {n: r for n, r in result["runs"].items() if r["finished"]}

    def gaps(pair, scale=1):    # {study-batch step: Switch minus dense}; {} unless both finished
        if not all(r.name in runs for r in pair):
            return {}
        at = [dict(zip(runs[r.name]["steps"], runs[r.name]["eval_loss"])) for r in pair]
        return {s * scale: round(at[1][s] - at[0][s], 4) for s in sorted(set(at[0]) & set(at[1]))}

    wide = {s: gaps(batched(s, budget, rate), WIDER) for s in BATCH_SEEDS[budget]}
    done = [s for s in BATCH_SEEDS[budget] if wide[s]]
    if not done:
        return {}
    narrow = {s: gaps(rated(0.04, s)) for s in done}
    dense, switch = batched(done[0], budget, rate)
    out = {"batch": BATCH * WIDER, "learning_rate": rate,
           "steps": runs[dense.name]["train_steps"], "seeds": done,
           "dense": {s: runs[batched(s, budget, rate)[0].name]["final_eval_loss"] for s in done},
           "switch_8_nojitter": {s: runs[batched(s, budget, rate)[1].name]["final_eval_loss"]
                                 for s in done},
           "switch_minus_dense": {s: list(wide[s].values())[-1] for s in done},
           "switch_better": verdicts.compare({**result, "runs": runs}, switch.name, dense.name)}
    if any(narrow.values()):
        out[f"switch_minus_dense_at_batch_{BATCH}"] = {s: list(narrow[s].values())[-1]
                                                       for s in done if narrow[s]}
    out["by_tokens"] = {s: {f"steps_at_batch_{BATCH}": list(wide[s]),
                            "switch_minus_dense": list(wide[s].values()),
                            f"switch_minus_dense_at_batch_{BATCH}": [narrow[s].get(k)
                                                                     for k in wide[s]]}
                        for s in done}
    return out


def against_the_pair(result: dict, variants, key: str, questions: dict) -> dict:
    """Each run of ``variants`` (named ``key`` here) against dense and no-jitter Switch-8 at
    0.04 of its seed (the same schedule and batches, as long or longer): their held-out losses
    at each evaluation the variant made, its training cross-entropy against dense's, and at its
    last step one verdict per question ({"a_better_than_b": (a, b)}, each of ``key``, "dense"
    and "switch_8_nojitter") under the study's rule (paired by seed; with one seed, its
    reference spread). Seeds stopped at unlike steps get no verdict."""
    runs = {n: r for n, r in result["runs"].items() if r["finished"]}
    out, last = {"by_seed": {}}, {}
    for run in variants:
        dense, switch = (r.name for r in rated(0.04, run.seed))
        if not all(n in runs for n in (run.name, dense, switch)):
            continue
        at = {k: dict(zip(runs[n]["steps"], runs[n]["eval_loss"]))
              for k, n in ((key, run.name), ("dense", dense), ("switch_8_nojitter", switch))}
        steps = sorted(set(at[key]) & set(at["dense"]) & set(at["switch_8_nojitter"]))
        if not steps:
            continue
        seed = out["by_seed"][run.seed] = {"steps": steps, **{
            k: [round(v[s], 4) for s in steps] for k, v in at.items()}}
        for k in (key, "switch_8_nojitter"):
            seed[f"{k}_minus_dense"] = [round(at[k][s] - at["dense"][s], 4) for s in steps]
        training = verdicts.train_and_held_out(runs[run.name], runs[dense])
        if training:
            seed[f"{key}_minus_dense_train"] = training["train_minus_baseline"]
        last[run.seed] = {k: v[steps[-1]] for k, v in at.items()}, steps[-1]
    ends = {step for _, step in last.values()}
    if len(ends) != 1:                     # no seed finished, or seeds judged at unlike steps
        return out if out["by_seed"] else {}
    ref = verdicts.reference(result)
    first = min(last)                    # verdicts are named by their lowest judged seed's runs
    names = {key: next(r.name for r in variants if r.seed == first),
             **dict(zip(("dense", "switch_8_nojitter"), (r.name for r in rated(0.04, first))))}

    def judged(better, worse):
        c = noise.compare({s: v[better] for s, (v, _) in last.items()},
                          {s: v[worse] for s, (v, _) in last.items()}, ref)
        return {"runs": [names[better], names[worse]], **c, "verdict": noise.verdict(c)}
    out["at_step"] = ends.pop()
    out.update({q: judged(*pair) for q, pair in questions.items()})
    return out


def wide_effects(result: dict) -> dict:
    """Dense with Switch-8's parameters (WIDE): does a dense model with them beat dense (do FFN
    parameters seen by every token pay on this task?), and does Switch-8 beat it?"""
    return against_the_pair(result, WIDE, "dense_wide", {
        "wide_better_than_dense": ("dense_wide", "dense"),
        "switch_better_than_wide": ("switch_8_nojitter", "dense_wide")})


def gate_effects(result: dict) -> dict:
    """Switch-8 with its gate's value held at 1 (GATE): does it beat Switch-8, and dense?"""
    return against_the_pair(result, GATE, "switch_8_unitgate", {
        "unit_gate_better_than_switch": ("switch_8_unitgate", "switch_8_nojitter"),
        "unit_gate_better_than_dense": ("switch_8_unitgate", "dense")})


def momentum_effects(result: dict) -> dict:
    """Switch-8 with Adafactor's first moment on its experts' updates (MOMENTUM): does
    averaging the experts' steps beat Switch-8, and dense? And under "dense_momentum", dense
    with every update so averaged (DENSE_MOMENTUM): does dense gain as much?"""
    out = against_the_pair(result, MOMENTUM, "switch_8_expmom", {
        "expert_momentum_better_than_switch": ("switch_8_expmom", "switch_8_nojitter"),
        "expert_momentum_better_than_dense": ("switch_8_expmom", "dense")})
    dense = against_the_pair(result, DENSE_MOMENTUM, "dense_mom", {
        "dense_momentum_better_than_dense": ("dense_mom", "dense")})
    return {**out, "dense_momentum": dense} if dense else out


def experts_effects(result: dict) -> dict:
    """Switch with fewer experts (FEWER; each expert sees more of a step's tokens), under
    "<E>_experts": does it beat Switch-8, and dense? A deficit that shrinks as E falls points
    at the tokens each expert sees a step."""
    out = {}
    for e in FEWER_EXPERTS:
        key = f"switch_{e}"
        got = against_the_pair(result, [r for r in FEWER if r.model.endswith(f"_{e}")], key, {
            f"{key}_better_than_switch_8": (key, "switch_8_nojitter"),
            f"{key}_better_than_dense": (key, "dense")})
        if got:
            out[f"{e}_experts"] = got
    return out


def frozen_effects(result: dict) -> dict:
    """Switch-8 whose routers stop moving at FREEZE_STEP (FROZEN): does it beat Switch-8, and
    dense?"""
    return against_the_pair(result, FROZEN, "switch_8_frozen", {
        "frozen_better_than_switch": ("switch_8_frozen", "switch_8_nojitter"),
        "frozen_better_than_dense": ("switch_8_frozen", "dense")})


def bias_effects(result: dict) -> dict:
    """Switch-8 balanced by a bias on the choice, with no auxiliary loss (BIAS): does it beat
    Switch-8, and dense?"""
    return against_the_pair(result, BIAS, "switch_8_bias", {
        "bias_better_than_switch": ("switch_8_bias", "switch_8_nojitter"),
        "bias_better_than_dense": ("switch_8_bias", "dense")})


def router_effects(result: dict) -> dict:
    """Each finished ROUTER run against switch_8 and dense of its own seed: its final held-out
    loss, the margins, the verdict against dense under the study's noise rule (like for like
    over the seeds both finished, verdicts.compare: with one seed, the study's reference
    spread, which needs a model run at two seeds, e.g. dense and dense_s1; without one the
    verdict says "no noise estimate"), and its routers' entropy over the last training
    interval beside switch_8's ([encoder, decoder]; uniform over 8 experts: ln 8 = 2.079
    nats)."""
    runs = {n: r for n, r in result["runs"].items() if r["finished"]}
    out = {}
    for run in ROUTER:
        r = runs.get(run.name)
        base = runs.get(harness.seeded_name("switch_8", run.seed))
        dense = runs.get(harness.seeded_name("dense", run.seed))
        if r is None or base is None or dense is None:
            continue
        out[run.name] = {
            "change": " ".join(run.flags) or f"model {run.model}",
            "final_eval_loss": r["final_eval_loss"],
            "minus_switch_8": round(r["final_eval_loss"] - base["final_eval_loss"], 4),
            "minus_dense": round(r["final_eval_loss"] - dense["final_eval_loss"], 4),
            "against_dense": verdicts.compare({**result, "runs": runs}, run.name,
                                              harness.seeded_name("dense", run.seed)),
            "router_entropy_train": r.get("router_entropy_train"),
            "switch_8_router_entropy_train": base.get("router_entropy_train")}
    return out
