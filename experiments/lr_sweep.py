"""Each model at its own best learning rate: dense and Switch-8 on a log grid of rates, and
T5's literal schedule shape, at the LM study's budget (issue 35, step 1); then the LM study's
headline questions at each model's best rate (``at_best``), Switch Table 1's rows there, and
the pair continued to twice the steps (``_long``).

    python experiments/lr_sweep.py --out runs/lr_sweep --corpus runs/corpus [--runs NAMES]
    python experiments/lr_sweep.py --out runs/lr_sweep --corpus runs/corpus --report [--publish]

Trains dense_lm_cpu and switch_lm_cpu_8 for --steps (2,400) at every rate of --rates
(0.005 ... 0.08: a log grid around the probe's finding that 0.02 beats 0.01 for both, 0.08
added when dense at 0.04 led every lower rate),
otherwise as experiments/lm_claims.py trains its dense and switch_8 (corpus, vocabulary, seed,
data order, the rsqrt schedule in T5's shape with warm-up --warmup 250). Then, at each model's
best rate, the same run with T5's schedule shape held constant through the run (warm-up >= the
steps: lr x sqrt(k / max(step, k)) never decays), the ``_const`` runs. Each run is resumable
(out/<run>/); --runs trains only those named (one process per core: split the names, with
--vocab so that no two processes train the vocabulary). The
report (out/lr_sweep.json, or docs/ with --publish) gives every run's curve, each model's final
loss by rate, its best rate (a rate that is best at an end of the grid is flagged: the optimum
may lie beyond it) and the Switch-minus-dense gap at each rate and at each one's best; and
``wide_rates``: the dense upper bound dense_wide, which at_best runs at dense's best rate, at
the grid's rates either side of it too (seed 0), so that its own best rate is known.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import harness  # noqa: E402
import plots  # noqa: E402
import lm_claims  # noqa: E402
import verdicts  # noqa: E402
from harness import Run  # noqa: E402

MODELS = {"dense": "dense_lm_cpu", "switch_8": "switch_lm_cpu_8"}
RUNGS = {"switch_16": "switch_lm_cpu_16", "switch_32": "switch_lm_cpu_32"}   # Figure 4's
# Switch Table 1's rows (lm_claims' names): top-1 / top-2 at capacity factors 1.0, 1.25, 2.0
# (top-1 at 1.25 is switch_8 itself), Switch-8's model with the row's flags
TABLE1 = {"top2_8": lm_claims.TOP2, "switch_8_cf1.0": lm_claims.cf(1.0),
          "top2_8_cf1.0": lm_claims.TOP2 + lm_claims.cf(1.0), "switch_8_cf2.0": lm_claims.cf(2.0),
          "top2_8_cf2.0": lm_claims.TOP2 + lm_claims.cf(2.0)}
# the dense upper bound: Switch-8's total parameters as dense FFNs (2.1x its FLOPs), at dense's
# best rate (not swept: a dense model's rate, the FFN width apart)
WIDE = {"dense_wide": "dense_lm_cpu_wide"}
RATES = (0.005, 0.01, 0.02, 0.04, 0.08)
SEEDS = (0, 1)
PAIR_SEEDS = (0, 1, 2)   # the dense / Switch-8 pair and its continuation: a third seed, where
                         # the fraction at twice the budget straddled the 2/3 goal


def name(model: str, rate: float, const: bool = False, seed: int = 0) -> str:
    return harness.seeded_name(f"{model}_lr{rate:g}" + ("_const" if const else ""), seed)


def runs(rates, steps: int, best: dict | None = None) -> list[Run]:
    """The grid, then (once ``best`` {model: rate} is known) the constant-schedule runs and
    at_best's."""
    out = [Run(name(m, r), model, (f"--config.learning_rate={r:g}",),
               baseline=None if m == "dense" else name("dense", r))
           for r in rates for m, model in MODELS.items()]
    for m, model in MODELS.items():
        if best and m in best:
            out.append(Run(name(m, best[m], True), model,
                           (f"--config.learning_rate={best[m]:g}",
                            f"--config.warmup_steps={steps}"),
                           baseline=None if m == "dense" else name("dense", best["dense"], True)
                           if "dense" in best else None))
    if not (best and set(MODELS) <= set(best)):
        return out
    return out + at_best(best, steps) + wide_bracket(rates, best)


def wide_bracket(rates, best: dict) -> list[Run]:
    """dense_wide (seed 0) at the grid's rates either side of dense's best, whose rate it
    borrows: is the borrowed rate its own best too (wide_rates in the result)?"""
    i = list(rates).index(best["dense"])
    return [Run(name(m, r), model, (f"--config.learning_rate={r:g}",),
                baseline=name("dense", best["dense"]))
            for m, model in WIDE.items() for r in rates[max(i - 1, 0):i + 2]
            if r != best["dense"]]


def wide_rates(result: dict, rates, best: dict) -> dict:
    """dense_wide's final held-out loss (seed 0) at each rate of its bracket that finished, its
    best of them, and whether that is dense's best rate, at which at_best compares it."""
    out = {}
    for m in WIDE:
        by_rate = {r: final(result, name(m, r)) for r in rates}
        by_rate = {r: v for r, v in by_rate.items() if v is not None}
        if len(by_rate) > 1:
            own = min(by_rate, key=by_rate.get)
            out[m] = {"by_rate": {f"{r:g}": v for r, v in by_rate.items()},
                      "best_rate": own, "borrowed_rate": best["dense"]["rate"],
                      "borrowed_rate_is_best": own == best["dense"]["rate"],
                      "at_edge": own in (min(by_rate), max(by_rate))
                      and own != best["dense"]["rate"]}
    return out


def at_best(best: dict, steps: int) -> list[Run]:
    """The headline questions again at each model's best rate and schedule (the grid's, which
    decays): a second seed of the pair, and Figure 4's rungs (16 and 32 experts, at Switch-8's
    best rate: a Switch model's rate is the router's and the dense layers', which the expert
    count leaves alone) on both seeds, Table 1's rows, and the dense upper bound (dense_wide,
    at dense's best rate) on both seeds. Each is compared with dense of its own seed."""
    dense = lambda seed: name("dense", best["dense"], seed=seed)  # noqa: E731
    out = [Run(name(m, best[m], seed=s), model, (f"--config.learning_rate={best[m]:g}",),
               seed=s, baseline=None if m == "dense" else dense(s))
           for m, model in MODELS.items() for s in PAIR_SEEDS[1:]]
    rate = (f"--config.learning_rate={best['switch_8']:g}",)
    out += [Run(name(m, best["switch_8"], seed=s), model, rate, seed=s, baseline=dense(s))
            for m, model in RUNGS.items() for s in SEEDS]
    # Table 1's rows, seed 0 of every row before any seed 1
    out += [Run(name(m, best["switch_8"], seed=s), MODELS["switch_8"], rate + flags,
                seed=s, baseline=dense(s))
            for s in SEEDS for m, flags in TABLE1.items()]
    wide = (f"--config.learning_rate={best['dense']:g}",)
    out += [Run(name(m, best["dense"], seed=s), model, wide, seed=s, baseline=dense(s))
            for m, model in WIDE.items() for s in SEEDS]
    # twice the budget: each best-rate run continued (lm_claims' dense_long and switch_8_long;
    # resume is bitwise and the schedule ignores the total, so this is the longer run from
    # scratch), seed 0 of both before seed 1, before seed 2
    return out + [Run(long(m, best[m], s), model, (f"--config.learning_rate={best[m]:g}",),
                      seed=s, steps=2 * steps, baseline=long("dense", best["dense"], s),
                      before=lm_claims.continues(name(m, best[m], seed=s)))
                  for s in PAIR_SEEDS for m, model in MODELS.items()]


def long(model: str, rate: float, seed: int = 0) -> str:
    return harness.seeded_name(name(model, rate) + "_long", seed)


def names(rates) -> set[str]:
    """Every run --runs may name: the grid's, and at every rate the constant-schedule run and
    the seed and expert-count runs of at_best (which of those trains follows the report's best
    rates)."""
    return ({name(m, r, const) for m in MODELS for r in rates for const in (False, True)}
            | {name(m, r, seed=s) for m in (*RUNGS, *TABLE1, *WIDE) for r in rates
               for s in SEEDS}
            | {name(m, r, seed=s) for m in MODELS for r in rates for s in PAIR_SEEDS}
            | {long(m, r, s) for m in MODELS for r in rates for s in PAIR_SEEDS})


def final(result: dict, run: str) -> float | None:
    """The run's last held-out loss, once it has trained all its steps (a run still going, or
    stopped early, has no final loss: its last evaluation is from an earlier step)."""
    r = result["runs"].get(run)
    return r["eval_loss"][-1] if r and r.get("finished") and r["eval_loss"] else None


def best_rates(result: dict, rates) -> dict:
    """{model: {"rate", "loss", "at_edge"}} over the finished grid runs."""
    out = {}
    for m in MODELS:
        losses = {r: final(result, name(m, r)) for r in rates}
        losses = {r: v for r, v in losses.items() if v is not None}
        if not losses:
            continue
        r = min(losses, key=losses.get)
        out[m] = {"rate": r, "loss": losses[r], "by_rate": {f"{k:g}": v for k, v in losses.items()},
                  "at_edge": r in (min(rates), max(rates)) and len(losses) == len(rates),
                  "rates_not_finished": [k for k in rates if k not in losses]}
    return out


def at_best_claims(result: dict, best: dict) -> dict:
    """experiments/lm_claims.py's goals (steps to dense's final loss, the gap against the seed
    noise, Figure 4's doubling of experts) over the runs at each model's best rate: lm_claims'
    run names, each mapped onto this sweep's run (``runs`` in the answer says which)."""
    rate = {m: best[m]["rate"] for m in MODELS}
    rate.update({m: rate["switch_8"] for m in (*RUNGS, *TABLE1)})
    rate.update({m: rate["dense"] for m in WIDE})
    key = harness.seeded_name                          # lm_claims' run names
    names, mapped = {}, {}
    for m in (*MODELS, *RUNGS, *TABLE1, *WIDE):
        for s in PAIR_SEEDS if m in MODELS else SEEDS:
            run = result["runs"].get(name(m, rate[m], seed=s))
            if run and run["finished"]:
                names[key(m, s)] = name(m, rate[m], seed=s)
                # each against dense at dense's best rate and its own seed (a grid run's
                # recorded baseline is dense at the Switch run's rate)
                mapped[key(m, s)] = {**run, "baseline": key("dense", s),
                                     "fraction_of_baseline_steps": None}
    for m in MODELS:
        for s in PAIR_SEEDS:
            run = result["runs"].get(long(m, rate[m], s))
            if run and run["finished"]:
                names[key(m + "_long", s)] = long(m, rate[m], s)
                mapped[key(m + "_long", s)] = {**run, "baseline": key("dense_long", s),
                                               "fraction_of_baseline_steps": None}
    verdicts.against_baselines(mapped)
    return {"runs": names, **lm_claims.claims({**result, "runs": mapped})}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--corpus", type=pathlib.Path, required=True)
    p.add_argument("--rates", type=float, nargs="+", default=list(RATES))
    p.add_argument("--steps", type=int, default=2400)
    p.add_argument("--warmup", type=int, default=250)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--eval-examples", type=int, default=2000)
    p.add_argument("--vocab", type=pathlib.Path, help="a tokenizer.model every run reads "
                   "(default: the first grid run trains one; give it when several processes "
                   "share the sweep, e.g. lm_claims' runs/lm/dense/tokenizer.model)")
    p.add_argument("--runs", nargs="+", help="train only these (default: every unfinished "
                   "grid run, then at the best rates the constant-schedule runs and the "
                   "pair's seeds 1 and 2, the 16/32-expert rungs, Switch Table 1's rows and "
                   "the dense upper bound dense_wide on two seeds and at the grid's rates "
                   "either side of dense's best, and the pair continued to twice the steps on "
                   "three: thirty runs more)")
    p.add_argument("--report", action="store_true", help="only collect what has run")
    harness.publish_argument(p)
    args = p.parse_args(argv)
    if harness.missing_corpus(args.corpus):
        return 2
    if any(r <= 0 or not math.isfinite(r) for r in args.rates):
        print(f"error: --rates {args.rates}: every rate must be a positive number",
              file=sys.stderr)
        return 2
    rates = sorted(set(args.rates))
    flags = lm_claims.study(argparse.Namespace(
        name="lr_sweep", corpus=args.corpus, steps=args.steps, eval_every=args.eval_every,
        warmup=args.warmup, eval_examples=args.eval_examples)).flags

    def study(best=None):
        return harness.Study(name="lr_sweep", config="configs/lm_cpu.py",
                             runs=runs(rates, args.steps, best), steps=args.steps,
                             eval_every=args.eval_every, flags=flags, vocab=args.vocab,
                             title="dense and Switch-8 by learning rate")
    grid = study()
    # the build of the text the runs read (runs/corpus is rebuilt as Debian moves) and its size
    # in the study's tokens; the published runs of the same text and tokens are carried over
    vocab = args.vocab or args.out / grid.runs[0].name / "tokenizer.model"
    about = lambda s: harness.collect(  # noqa: E731
        s, args.out, harness.command_line("lr_sweep.py", args),
        corpus=lm_claims.corpus_about(args.corpus, vocab))
    unknown = sorted(set(args.runs or ()) - names(rates))
    if unknown:
        print(f"error: --runs {unknown}: not runs of this sweep (names: MODEL_lrRATE, "
              "MODEL_lrRATE_const, MODEL_lrRATE_long or MODEL_lrRATE_s1, MODEL dense or "
              "switch_8, or switch_16 / "
              "switch_32, dense_wide or a Table 1 row (top2_8, switch_8_cf1.0, top2_8_cf1.0, "
              "switch_8_cf2.0, top2_8_cf2.0) without _const; RATE one of --rates)",
              file=sys.stderr)
        return 2
    wanted = lambda names: [n for n in names if not args.runs or n in args.runs]  # noqa: E731
    best = {m: b["rate"] for m, b in best_rates(about(grid), rates).items()}
    idle = sorted(set(args.runs or ()) - {r.name for r in study(best).runs})
    if idle and not args.report:         # a run of another rate than the best: nothing trains it
        rated = ", ".join(f"{m} {r:g}" for m, r in best.items()) or "none yet"
        print(f"error: --runs {idle}: the runs beyond the grid train at each model's best "
              f"rate, which the finished grid puts at: {rated}; name them at that rate "
              "(or finish the grid first)", file=sys.stderr)
        return 2
    if not args.report and wanted(r.name for r in grid.runs):
        harness.run(grid, args.out, only=wanted(r.name for r in grid.runs))
        best = {m: b["rate"] for m, b in best_rates(about(grid), rates).items()}   # again
    full = study(best)
    later = wanted(r.name for r in full.runs if r.name not in {g.name for g in grid.runs})
    if not args.report and later:
        harness.run(full, args.out, only=later)
    result = about(full)
    result["rates"] = rates
    result["best"] = best_rates(result, rates)
    result["switch_minus_dense"] = {
        f"lr{r:g}": round(final(result, name("switch_8", r)) - final(result, name("dense", r)), 4)
        for r in rates if final(result, name("switch_8", r)) is not None
        and final(result, name("dense", r)) is not None}
    b = result["best"]
    if "dense" in b and "switch_8" in b:
        result["switch_minus_dense"]["each_at_its_best"] = round(
            b["switch_8"]["loss"] - b["dense"]["loss"], 4)

    if {"dense", "switch_8"} <= set(b):
        result["at_best"] = at_best_claims(result, b)
        result["wide_rates"] = wide_rates(result, rates, b)
        # training against held-out loss of the pair at twice the budget (~2.9 passes over
        # the text): does Switch-8 fit the text it has seen faster than the text it has not?
        result["train_and_held_out"] = verdicts.train_and_held_out_pairs(result, [
            (long("switch_8", b["switch_8"]["rate"], s), long("dense", b["dense"]["rate"], s))
            for s in PAIR_SEEDS])
    grid_names = {r.name for r in grid.runs if not r.name.endswith("_const")}

    def plot(res: dict, path: pathlib.Path) -> None:
        done = [n for n, r in res["runs"].items() if r["finished"]]
        panels = {f"learning rate sweep, {args.steps} steps": [n for n in done if n in grid_names]}
        if "at_best" in res:
            mapped = res["at_best"]["runs"]        # lm_claims' name -> this sweep's run
            rows = {mapped[k] for k in mapped if k.removesuffix("_s1") in TABLE1}
            longs = {mapped[k] for k in mapped if "_long" in k}
            panels["at each model's best rate: seeds, experts, width, constant schedule"] = [
                n for n in done if (n in mapped.values() or "_const" in n
                                    or any(n.startswith(m + "_lr") for m in WIDE))
                and n not in rows | longs]
            pair = [mapped[k] for k in ("dense", "switch_8", "dense_s1", "switch_8_s1")
                    if k in mapped]
            panels["Switch Table 1's rows at Switch-8's best rate"] = pair + sorted(rows)
            panels["twice the budget (continued)"] = pair + sorted(longs)
        harness.plot_curves(res, path, panels)
        claims = res.get("at_best", {})
        series = {**claims.get("switch_8_speedup_long", {}).get("by_budget", {}),
                  **claims.get("switch_8_speedup", {}).get("by_budget", {})}
        if series:      # the speed-up at every budget: figures/<study>_speedup.png
            plots.plot_fractions(
                {f"{k} vs {k.replace('switch_8', 'dense')}": v for k, v in series.items()},
                path.with_name(path.stem + "_speedup.png"),
                title="Switch-8 at its best rate: fraction of dense's steps to its loss")
        if res.get("train_and_held_out"):   # figures/<study>_train_held_out.png
            plots.plot_train_and_held_out(
                res["train_and_held_out"], path.with_name(path.stem + "_train_held_out.png"),
                title="Switch-8 minus dense at twice the budget (each at its best rate)")
    harness.write(result, args.out, plot, publish=args.publish)
    print(json.dumps({"best": result["best"], "switch_minus_dense":
                      result["switch_minus_dense"], "at_best": result.get("at_best")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
