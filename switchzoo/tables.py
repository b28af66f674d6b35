"""The papers' tables: published numbers beside ours, from finished runs.

    python -m switchzoo.tables --list
    python -m switchzoo.tables --table=switch_table1 --runs=runs/a,runs/b

Each file in configs/tables/ is data: ``TABLE`` (the paper's table with its published numbers)
and optionally ``MINI`` (a CPU-sized variant over the tiny catalogue models, with no published
numbers but the orderings the paper shows). They are named after the file, ``<stem>`` and
``<stem>_mini``. A row's ``match`` selects runs by values in the run's config.json (dotted
keys; a null ``moe.*`` override means the catalogue default, which is what is compared);
``match=None`` marks a row no catalogue model reproduces.

Runs that match one row and differ only by their config's ``seed`` (how often they log,
evaluate and checkpoint, and where they read the vocabulary from, are not differences; the
vocabulary is compared by content) are shown as one row: the mean over the seeds, with their
spread (max - min). Otherwise the run evaluated at the latest step is shown. Each ordering the
paper shows is judged by the one seed-noise rule (switchzoo.noise): each 'better' row against
each 'worse' row over the seeds both ran, the margin the mean same-seed gap in the metric's good
direction, the noise a paired t-test's 95% half-width over those gaps (two or more common
seeds), else one from the table's largest one-row seed sd; the ordering's margin is its
pairs' smallest.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import pathlib
import statistics
import sys

from switchzoo import noise, record, registry, scores

TABLES = "switchzoo.configs.tables"          # the tables package (configs/tables/ in a clone)
_REQUIRED = ("title", "source", "metric", "columns", "rows", "command")
# Metrics where a larger number is better; every other metric (loss, perplexities) is lower-better.
HIGHER_IS_BETTER = {"bleu", "neg_log_perplexity", "task_score"}
SEED = "seed"
# Config keys that do not change what a run measures: how often it logs, evaluates and
# checkpoints, and where it reads its vocabulary from (compared by content instead: _vocabulary).
BOOKKEEPING = ("log_every_steps", "eval_every_steps", "checkpoint_every_steps",
               "keep_checkpoints", "data.vocab_path")


def _load_all() -> dict[str, dict]:
    tables: dict[str, dict] = {}
    for module in registry.modules(TABLES):
        for suffix, attr in (("", "TABLE"), ("_mini", "MINI")):
            if hasattr(module, attr):
                tables[registry.stem(module) + suffix] = _validate(
                    getattr(module, attr), f"{module.__name__}.{attr}")
    return tables


def _validate(table: dict, where: str) -> dict:
    missing = [k for k in _REQUIRED if k not in table]
    if missing:
        raise ValueError(f"{where}: missing keys {missing}; a table needs {list(_REQUIRED)}")
    labels = set()
    for i, row in enumerate(table["rows"]):
        for key in ("label", "match", "published"):
            if key not in row:
                raise ValueError(f"{where}: row {i} has no '{key}' (rows need label, match, "
                                 "published; match=None for rows no catalogue model runs)")
        if row["label"] in labels:
            raise ValueError(f"{where}: two rows are labelled '{row['label']}'")
        labels.add(row["label"])
    for claim in table.get("orderings", ()):
        for label in _as_list(claim["better"]) + _as_list(claim["worse"]):
            if label not in labels:
                raise ValueError(f"{where}: ordering '{claim['claim']}' names row '{label}', "
                                 f"which is not a row label")
    return table


def names() -> list[str]:
    return list(_load_all())


def get(name: str) -> dict:
    return registry.lookup(_load_all(), name, "table")


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _lookup(config: dict, dotted: str):
    value = config
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    # A null (or absent) routing override means the catalogue's value, which is what ran.
    if value is None and dotted.startswith("moe."):
        value = _catalogue_moe_default(config.get("model"), dotted[len("moe."):])
    return value


def _catalogue_moe_default(model, field: str):
    from switchzoo import zoo
    try:
        moe = zoo.get(model).moe
    except (ValueError, TypeError):
        return None
    return getattr(moe, field, None) if moe is not None else None


def _equal(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def matches(row: dict, config: dict) -> bool:
    """Whether a run's resolved config.json satisfies every key of the row's match."""
    if row["match"] is None:
        return False
    return all(_equal(_lookup(config, k), v) for k, v in row["match"].items())


def load_run(run_dir) -> dict:
    """{"dir", "config", "results"} of one finished run; one-line errors for what is missing."""
    run_dir = pathlib.Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run dir '{run_dir}' does not exist")
    config_path = run_dir / "config.json"
    if not config_path.is_file():
        raise ValueError(f"run dir '{run_dir}' has no config.json: is it a train.py --workdir?")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{config_path}: not valid JSON ({e})") from None
    return {"dir": str(run_dir), "config": config, "results": scores.read_results(run_dir)}


def _step(run: dict) -> int:
    """The step a run's results describe; a fine-tune's (scored at its best checkpoint, a
    step that differs by seed) its length, so that its seeds are one row."""
    if "tasks" in run["results"]:
        return run["config"].get("num_train_steps") or 0
    return run["results"].get("step") or 0


def _vocabulary(run: dict):
    """What identifies a run's vocabulary: the sha1 of its SentencePiece model (data.vocab_path,
    else the workdir's tokenizer.model), else the path it names (None: neither)."""
    path = (run["config"].get("data") or {}).get("vocab_path") or ""
    model = (pathlib.Path(path).expanduser() if path
             else pathlib.Path(run["dir"]) / "tokenizer.model")
    if model.is_file():
        return hashlib.sha1(model.read_bytes()).hexdigest()
    return path or None


def _setup(run: dict) -> dict:
    """The run's config without its seed and bookkeeping, moe.* resolved to what ran, numbers
    as floats (1 and 1.0 are one capacity factor): runs with equal setups differ only by seed."""
    flat = record.flatten(run["config"])
    for key in [k for k in flat if k.startswith("moe.")]:
        flat[key] = _lookup(run["config"], key)
    for key in BOOKKEEPING + (SEED,):
        flat.pop(key, None)
    flat["vocabulary"] = _vocabulary(run)
    return {k: float(v) if isinstance(v, int) and not isinstance(v, bool) else v
            for k, v in flat.items()}


def _why_not_shown(run: dict, shown: list[dict], setup: dict) -> str:
    step = f"step {run['results'].get('step')}"
    if _step(run) != _step(shown[0]):
        return step
    other = _setup(run)
    diff = sorted(k for k in set(setup) | set(other) if setup.get(k) != other.get(k))
    if diff:
        return f"{step}; differs in {', '.join(diff[:3])}{', ...' if len(diff) > 3 else ''}"
    return f"{step}; seed {run['config'].get(SEED)} again"


def _assign(table: dict, runs: list[dict]):
    """row label -> the runs shown (one, or the seeds of one setup at the latest step), notes,
    unmatched runs."""
    chosen, notes, unmatched = {}, [], []
    by_row: dict[str, list[dict]] = {}
    for run in runs:
        hits = [row["label"] for row in table["rows"] if matches(row, run["config"])]
        if not hits:
            unmatched.append(run)
        for label in hits:
            by_row.setdefault(label, []).append(run)
    for label, candidates in by_row.items():
        best = max(candidates, key=_step)                 # the first of the latest
        setup, group, seeds = _setup(best), [], set()
        for run in candidates:
            seed = run["config"].get(SEED) or 0          # configs/base.py's default
            if _step(run) == _step(best) and seed not in seeds and _setup(run) == setup:
                group.append(run)
                seeds.add(seed)
        chosen[label] = group
        others = [r for r in candidates if not any(r is g for g in group)]
        if others:
            step = best["results"].get("step")
            shown = (f"{best['dir']} (step {step}, the latest)" if len(group) == 1 else
                     f"the mean of {', '.join(r['dir'] for r in group)} (seeds "
                     f"{', '.join(str(r['config'].get(SEED)) for r in group)}; step {step}, the "
                     f"latest)")
            not_shown = ", ".join(f"{r['dir']} ({_why_not_shown(r, group, setup)})"
                                  for r in others)
            notes.append(f"{label}: {len(candidates)} runs match; shown: {shown}; not shown: "
                         f"{not_shown}")
    return chosen, notes, unmatched


def _ours_one(run: dict, key: str):
    results = run["results"]
    if key in results:
        return results[key]
    return scores.routing_summary(results).get(key)


def _numbers(values: list) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _ours(group: list[dict] | None, key: str):
    """The row's value: the run's, or the mean over its seeds (None if a seed lacks it)."""
    values = [_ours_one(run, key) for run in group or ()]
    if not values or any(v is None for v in values):
        return None
    if all(v == values[0] for v in values):
        return values[0]
    return statistics.fmean(values) if _numbers(values) else None


def _spread(group: list[dict] | None, key: str) -> float | None:
    """max - min of the row's value over its seeds; None for one run (no spread measured)."""
    values = [_ours_one(run, key) for run in group or ()]
    return noise.spread(values) if _numbers(values) else None


def check_ordering(name: str, run_dirs: list[str]) -> list[dict]:
    """Each of the table's orderings: {"claim", "holds" (None: a row has no run, or two rows no
    seed in common), "margin" (the smallest pair margin), "compared" (the pair that decides the
    noise verdict), "pair_margin", "seeds", "noise", "noise_from", "ratio" (that pair's, from
    noise.compare), "within_noise" (None: one seed in every row, no noise estimate), "detail"}.
    A claim holds when every (better, worse) pair does; the pair that decides is the one with
    the least margin / noise (signed): the claim is beyond noise when every pair is (holds), or
    when a failing pair is (fails)."""
    table = get(name)
    chosen, _, _ = _assign(table, [load_run(d) for d in run_dirs])
    return [_check(claim, table, chosen) for claim in table.get("orderings", ())]


def _by_seed(group: list[dict] | None, key: str) -> dict:
    return {run["config"].get(SEED) or 0: _ours_one(run, key) for run in group or ()}


def _evidence(c: dict) -> float:
    """margin / noise with its sign: how far a pair is from level in units of its noise."""
    if c["noise"] is None:
        return c["margin"]
    if c["noise"] > 0:
        return c["margin"] / c["noise"]
    return math.copysign(math.inf, c["margin"]) if c["margin"] else 0.0


def _check(claim: dict, table: dict, chosen: dict) -> dict:
    metric = claim.get("metric", table["metric"])
    higher = metric in HIGHER_IS_BETTER
    better, worse = _as_list(claim["better"]), _as_list(claim["worse"])
    labels = list(dict.fromkeys(better + worse))
    values = {label: _ours(chosen.get(label), metric) for label in labels}
    result = {"claim": claim["claim"], "holds": None, "margin": None, "compared": None,
              "pair_margin": None, "seeds": None, "noise": None, "noise_from": None,
              "df": None, "ratio": None, "within_noise": None}
    missing = [label for label, v in values.items() if v is None]
    if missing:
        return {**result, "detail": "no run for " + ", ".join(missing)}
    groups = {label: _by_seed(group, metric) for label, group in chosen.items()}
    ref = noise.reference({k: g for k, g in groups.items()
                           if g and _numbers(list(g.values()))})
    pairs = {(b, w): noise.compare(groups[b], groups[w], ref, higher)
             for b in better for w in worse}
    detail = ", ".join(
        f"{label}: {scores.fmt(v)}" + (f" (mean of {len(chosen[label])} seeds)"
                                       if len(chosen[label]) > 1 else "")
        for label, v in values.items())
    apart = [f"{b} (seeds {_seeds(groups[b])}) and {w} (seeds {_seeds(groups[w])})"
             for (b, w), c in pairs.items() if not c["seeds"]]
    if apart:
        return {**result, "detail": f"no seed in common: {'; '.join(apart)}; {metric}: {detail}"}
    # The weakest pair decides: the claim holds beyond noise when every pair is beyond it, and
    # fails beyond noise when a failing pair is (that pair has the most negative margin/noise).
    pair = min(pairs, key=lambda p: _evidence(pairs[p]))
    c = pairs[pair]
    return {**result, "holds": all(q["better"] for q in pairs.values()),
            "margin": min(q["margin"] for q in pairs.values()),
            "compared": list(pair), "seeds": c["seeds"], "noise": c["noise"],
            "noise_from": c["noise_from"], "df": c["df"], "ratio": c["ratio"],
            "within_noise": None if c["beyond_noise"] is None else not c["beyond_noise"],
            "pair_margin": c["margin"], "detail": f"{metric}: {detail}"}


def _seeds(seeds) -> str:
    return ", ".join(str(s) for s in sorted(seeds))


def _ordering_line(result: dict) -> str:
    mark = {True: "holds", False: "FAILS", None: "untested"}[result["holds"]]
    if result["holds"] is None:
        return f"- [{mark}] {result['claim']} ({result['detail']})"
    if result["within_noise"] is not None:
        mark += ", within noise" if result["within_noise"] else ", beyond noise"
    seeds = result["seeds"]
    judged = f"seed{'s' if len(seeds) > 1 else ''} {_seeds(seeds)}"
    if result["pair_margin"] != result["margin"]:
        judged = (f"judged on {result['compared'][0]} vs {result['compared'][1]}, "
                  f"{result['pair_margin']:+.4g} over {judged}")
    if result["noise"] is None:
        verdict = "no noise estimate: one seed per row"
    else:
        source = ("paired t over the same-seed gaps" if result["noise_from"] == "paired"
                  else "from the largest seed sd of one row")
        verdict = (f"noise {result['noise']:.4g} (95%, {source}, {result['df']} df), "
                   f"{result['ratio']:.1f}x")
    return (f"- [{mark}] {result['claim']} (margin {result['margin']:+.4g}; {judged}; "
            f"{verdict}; {result['detail']})")


def collect(name: str, run_dirs: list[str]) -> str:
    """The paper's table in Markdown: published columns, then ours from the matching runs."""
    table = get(name)
    runs = [load_run(d) for d in run_dirs]
    chosen, notes, unmatched = _assign(table, runs)
    wanted = ", ".join(dict.fromkeys(r["match"]["model"] for r in table["rows"]
                                     if r["match"] and "model" in r["match"]))
    if runs and len(unmatched) == len(runs):
        raise ValueError(
            f"no run matches a row of {name}: its rows are models {wanted}, the runs' are "
            f"{', '.join(dict.fromkeys(str(r['config'].get('model')) for r in runs))} "
            f"(eval.py --table={name} without --runs prints the command that trains its rows)")
    ours = table.get("ours", [(table["metric"], f"{table['metric']} (ours)")]) + [("step", "step")]
    seeded = any(len(group) > 1 for group in chosen.values())   # a seeds column where one counts
    header = ["Model"] + [h for _, h in table["columns"]] + [h for _, h in ours] + (
        [f"seeds (spread of {table['metric']})"] if seeded else []) + ["run"]
    lines = [f"## {table['title']}", "", f"Source: {table['source']}", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table["rows"]:
        group = chosen.get(row["label"])
        cells = [row["label"]] + [scores.fmt(row["published"].get(k), exact=True)
                                  for k, _ in table["columns"]]
        cells += [scores.fmt(_ours(group, k)) for k, _ in ours]
        if seeded:
            spread = _spread(group, table["metric"])
            cells.append("\u2014" if not group else ", ".join(
                str(r["config"].get(SEED)) for r in group) + (
                "" if spread is None else f" ({scores.fmt(float(spread))})"))
        cells.append(", ".join(r["dir"] for r in group) if group else (
            "no catalogue model" if row["match"] is None else "\u2014"))
        lines.append("| " + " | ".join(cells) + " |")
    if notes:
        lines += ["", "Notes:"] + [f"- {n}" for n in notes]
    if unmatched:
        lines += ["", f"Unmatched runs: no row has their model and overrides (the rows' "
                      f"models: {wanted})"]
        for run in unmatched:
            cfg = run["config"]
            moe = {k: v for k, v in (cfg.get("moe") or {}).items() if v is not None}
            lines.append(f"- {run['dir']} (model {cfg.get('model')}, "
                         f"moe overrides {moe or 'none'})")
    if table.get("orderings"):
        lines += ["", f"Orderings the paper shows, by the noise rule (switchzoo.noise: "
                      f"{noise.RULE}; several rows a side: each pair, the smallest margin, the "
                      f"pair least beyond its noise decides):"]
        lines += [_ordering_line(_check(c, table, chosen)) for c in table["orderings"]]
    lines += ["", f"Reproduce: `{table['command']}`"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the table names")
    parser.add_argument("--table", help="a name from --list")
    parser.add_argument("--runs", default="", help="comma-separated run dirs (train.py workdirs)")
    args = parser.parse_args(argv)
    try:
        if args.list or not args.table:
            for name in names():
                print(f"{name:24s} {get(name)['title']}")
            return 0
        print(collect(args.table, [d for d in args.runs.split(",") if d]))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
