"""The arithmetic the claims studies read their results with: when a curve reaches a loss, which
runs differ only by seed, their spread and mean curve, and a comparison of two runs under the
one seed-noise rule (switchzoo.noise). Pure Python on harness.collect's result dict."""
from __future__ import annotations

import json
import pathlib
import statistics
import sys
from typing import Sequence

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from switchzoo import noise  # noqa: E402


def reach_step(curve: Sequence[tuple[int, float]], target: float) -> float | None:
    """The first step at which ``curve`` (step, loss) reaches ``target`` (loss <= target),
    linearly interpolated between the evaluation before it and the one that reaches it; the
    first evaluation's step when that one is already there (the crossing was earlier, unseen);
    None if it never does. A curve that dips below and rises again reached it at the dip."""
    previous = None
    for step, loss in curve:
        if loss <= target:
            if previous is None:
                return float(step)
            s0, l0 = previous
            return s0 + (l0 - target) / (l0 - loss) * (step - s0)
        previous = (step, loss)
    return None


def against_baselines(runs: dict[str, dict]) -> None:
    """Adds to each run summary (harness.summarise's) compared with another run (its
    ``baseline``): the step at which it first reaches the baseline's final eval loss
    (reach_step, rounded), that step over the baseline's last step, and its final loss minus
    the baseline's."""
    for name, s in runs.items():
        base = runs.get(s["baseline"]) if s["baseline"] else None
        if base is None or s["baseline"] == name:
            continue
        reached = reach_step(list(zip(s["steps"], s["eval_loss"])), base["final_eval_loss"])
        s["steps_to_baseline_final_loss"] = None if reached is None else round(reached)
        s["fraction_of_baseline_steps"] = (None if reached is None
                                           else round(reached / base["steps"][-1], 3))
        s["eval_loss_minus_baseline"] = round(s["final_eval_loss"] - base["final_eval_loss"], 4)


def fraction_by_budget(run: dict, baseline: dict) -> list[list]:
    """At each of the baseline's evaluations (step s, loss l): [s, the step at which ``run``
    reaches l over s], rounded to 3 decimals (None where it never does). How the speed-up
    fraction moves as the budget grows; its last entry is against_baselines' fraction."""
    curve = list(zip(run["steps"], run["eval_loss"]))
    out = []
    for step, loss in zip(baseline["steps"], baseline["eval_loss"]):
        reached = reach_step(curve, loss)
        out.append([step, None if reached is None else round(reached / step, 3)])
    return out


def train_and_held_out(run: dict, baseline: dict) -> dict | None:
    """At each evaluation both runs made (and logged training over the interval before):
    ``run`` minus ``baseline`` on the held-out loss and on the training cross-entropy of that
    interval, and each one's held-out minus training loss (its generalisation gap). Where the
    held-out gap moves against ``run`` while the training gap does not, ``run`` is fitting the
    text it has seen better than the text it has not, faster than ``baseline``. None without
    training curves (results collected before harness logged them)."""
    def points(r):
        return {s: (e, t) for s, e, t in zip(r["steps"], r["eval_loss"],
                                              r.get("train_cross_entropy") or ())
                if t is not None}
    a, b = points(run), points(baseline)
    steps = sorted(set(a) & set(b))
    if not steps:
        return None
    def minus(x, y, i, j):
        return [round(x[s][i] - y[s][j], 4) for s in steps]
    return {"steps": steps, "held_out_minus_baseline": minus(a, b, 0, 0),
            "train_minus_baseline": minus(a, b, 1, 1), "generalisation_gap": minus(a, a, 0, 1),
            "baseline_generalisation_gap": minus(b, b, 0, 1)}


def train_and_held_out_pairs(result: dict, pairs) -> dict:
    """{run: train_and_held_out(run, baseline)} over the (run, baseline) ``pairs`` that both
    finished and logged training curves."""
    runs = {n: r for n, r in result["runs"].items() if r["finished"]}
    out = {}
    for s, d in pairs:
        c = train_and_held_out(runs[s], runs[d]) if s in runs and d in runs else None
        if c is not None:
            out[s] = c
    return out


def _setup(run: dict) -> tuple:
    """What a run trains, but its seed (and its baseline, which names the seed's own dense)."""
    return run["model"], tuple(run.get("flags", ())), run.get("train_steps"), run.get(
        "starts_from")


def seeds(result: dict, name: str, key: str = "final_eval_loss") -> dict[int, float]:
    """{seed: value} of run ``name`` and of every run that differs from it only by seed (a
    run recorded without a seed ran seed 0)."""
    runs = result["runs"]
    if name not in runs:
        return {}
    setup = _setup(runs[name])
    out = {r.get("seed", 0): r[key] for n, r in runs.items()
           if n != name and _setup(r) == setup and r.get(key) is not None}
    if runs[name].get(key) is not None:
        out[runs[name].get("seed", 0)] = runs[name][key]
    return out


def reference(result: dict) -> tuple[float, int] | None:
    """The study's reference (switchzoo.noise.reference): (sd, degrees of freedom) of the most
    seed-sensitive model's final held-out loss over the runs that differ only by seed."""
    groups: dict[tuple, dict[int, float]] = {}
    for r in result["runs"].values():
        if r.get("final_eval_loss") is not None:
            groups.setdefault(_setup(r), {})[r.get("seed", 0)] = r["final_eval_loss"]
    return noise.reference({str(k): v for k, v in groups.items()})


def compare(result: dict, better: str, worse: str,
            ref: tuple[float, int] | None = None) -> dict:
    """Run ``better`` against run ``worse`` (final held-out loss, lower is better) under the
    one rule, like for like over their common seeds, with the study's reference unless
    ``ref`` is given; the runs and the verdict's words added."""
    ref = reference(result) if ref is None else ref
    c = noise.compare(seeds(result, better), seeds(result, worse), ref)
    return {"runs": [better, worse], **c, "verdict": noise.verdict(c)}


def seed_spread(result: dict, names: Sequence[str]) -> dict | None:
    """Mean and spread (max - min) of the final eval loss over runs that differ by seed."""
    names = [n for n in names if n in result["runs"]]
    losses = [result["runs"][n]["final_eval_loss"] for n in names]
    if len(losses) < 2:
        return None
    return {"runs": names, "mean": round(statistics.fmean(losses), 4),
            "spread": round(max(losses) - min(losses), 4)}


def mean_curve(result: dict, names: Sequence[str]) -> list[tuple[int, float]]:
    """The step-wise mean eval curve of runs that differ by seed (their common steps)."""
    curves = [dict(zip(result["runs"][n]["steps"], result["runs"][n]["eval_loss"]))
              for n in names if n in result["runs"]]
    common = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    return [(s, statistics.fmean(c[s] for c in curves)) for s in common]


def dropped(run: dict) -> list[float] | None:
    """A routed run's dropped fraction of its picks in training (last interval, per Switch
    layer), rounded to 3 decimals; None for a dense run."""
    d = run.get("dropped_fraction_train")
    return None if d is None else [round(x, 3) for x in d]


def with_seeds(result: dict, others: list[dict]) -> dict:
    """``result`` with the runs of the same study on other seeds (their results) added as
    NAME_sSEED: the comparisons then read like for like over every seed that ran."""
    runs = dict(result["runs"])
    for other in others:
        for name, r in other["runs"].items():
            runs.setdefault(f"{name}_s{r.get('seed', 0)}", r)
    return {**result, "runs": runs}


def seeds_from(paths: Sequence[pathlib.Path] | None, seed: int, study) -> list[dict]:
    """The results ``paths`` name (a --seeds-from flag): each the same study's recipe (config,
    flags, steps, evaluation interval) as ``study``'s on seeds other than ``seed``, or the
    command stops in one line."""
    others = []
    for p in paths or []:
        try:
            other = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            sys.exit(f"error: --seeds-from {p}: cannot read it as a study's JSON ({e})")
        recipe = {"config": study.config, "flags": list(study.flags), "steps": study.steps,
                  "eval_every": study.eval_every}
        differ = [k for k, v in recipe.items() if other.get(k) != v]
        seeds = {r.get("seed", 0) for r in other.get("runs", {}).values()}
        if differ:
            sys.exit(f"error: --seeds-from {p}: its {', '.join(differ)} differ from this "
                     "study's; give the result of the same command on another --seed")
        if seed in seeds:
            sys.exit(f"error: --seeds-from {p}: it ran seed {seed}, this study's own; "
                     "give the results of other seeds")
        others.append(other)
    return others
