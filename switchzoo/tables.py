"""The papers' tables: published numbers beside ours, from finished runs.

    python -m switchzoo.tables --list
    python -m switchzoo.tables --table=switch_table1 --runs=runs/a,runs/b

Each file in configs/tables/ is data: ``TABLE`` (the paper's table with its published numbers)
and optionally ``MINI`` (a CPU-sized variant over the tiny catalogue models, with no published
numbers but the orderings the paper shows). They are named after the file, ``<stem>`` and
``<stem>_mini``. A row's ``match`` selects runs by values in the run's config.json (dotted
keys; a null ``moe.*`` override means the catalogue default, which is what is compared);
``match=None`` marks a row no catalogue model reproduces.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

from switchzoo import registry, scores

TABLES = "switchzoo.configs.tables"          # the tables package (configs/tables/ in a clone)
_REQUIRED = ("title", "source", "metric", "columns", "rows", "command")
# Metrics where a larger number is better; every other metric (loss, perplexities) is lower-better.
HIGHER_IS_BETTER = {"bleu", "neg_log_perplexity"}


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


def _assign(table: dict, runs: list[dict]):
    """row label -> the run shown (latest step wins), notes, unmatched runs."""
    chosen, notes, unmatched = {}, [], []
    by_row: dict[str, list[dict]] = {}
    for run in runs:
        hits = [row["label"] for row in table["rows"] if matches(row, run["config"])]
        if not hits:
            unmatched.append(run)
        for label in hits:
            by_row.setdefault(label, []).append(run)
    for label, candidates in by_row.items():
        best = max(candidates, key=lambda r: r["results"].get("step") or 0)
        chosen[label] = best
        if len(candidates) > 1:
            others = ", ".join(f"{r['dir']} (step {r['results'].get('step')})"
                               for r in candidates if r is not best)
            notes.append(f"{label}: {len(candidates)} runs match; shown: {best['dir']} (step "
                         f"{best['results'].get('step')}, the latest); not shown: {others}")
    return chosen, notes, unmatched


def _ours(run: dict | None, key: str):
    if run is None:
        return None
    results = run["results"]
    if key in results:
        return results[key]
    return scores.routing_summary(results).get(key)


def check_ordering(name: str, run_dirs: list[str]) -> list[dict]:
    """Each of the table's orderings: {"claim", "holds": True / False / None (a run is missing),
    "detail"}. A claim holds when every 'better' row beats every 'worse' row on its metric."""
    table = get(name)
    chosen, _, _ = _assign(table, [load_run(d) for d in run_dirs])
    return [_check(claim, table, chosen) for claim in table.get("orderings", ())]


def _check(claim: dict, table: dict, chosen: dict) -> dict:
    metric = claim.get("metric", table["metric"])
    higher = metric in HIGHER_IS_BETTER
    better, worse = _as_list(claim["better"]), _as_list(claim["worse"])
    values = {label: _ours(chosen.get(label), metric) for label in better + worse}
    detail = ", ".join(f"{label}: {scores.fmt(v)}" for label, v in values.items())
    if any(v is None for v in values.values()):
        missing = [label for label, v in values.items() if v is None]
        return {"claim": claim["claim"], "holds": None,
                "detail": "no run for " + ", ".join(missing)}
    holds = all((values[b] > values[w]) if higher else (values[b] < values[w])
                for b in better for w in worse)
    return {"claim": claim["claim"], "holds": holds, "detail": f"{metric}: {detail}"}


def collect(name: str, run_dirs: list[str]) -> str:
    """The paper's table in Markdown: published columns, then ours from the matching runs."""
    table = get(name)
    runs = [load_run(d) for d in run_dirs]
    chosen, notes, unmatched = _assign(table, runs)
    ours = table.get("ours", [(table["metric"], f"{table['metric']} (ours)")]) + [("step", "step")]
    header = ["Model"] + [h for _, h in table["columns"]] + [h for _, h in ours] + ["run"]
    lines = [f"## {table['title']}", "", f"Source: {table['source']}", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table["rows"]:
        run = chosen.get(row["label"])
        cells = [row["label"]] + [scores.fmt(row["published"].get(k), exact=True)
                                  for k, _ in table["columns"]]
        cells += [scores.fmt(_ours(run, k)) for k, _ in ours]
        cells.append(run["dir"] if run else ("no catalogue model" if row["match"] is None
                                             else "\u2014"))
        lines.append("| " + " | ".join(cells) + " |")
    if notes:
        lines += ["", "Notes:"] + [f"- {n}" for n in notes]
    if unmatched:
        lines += ["", "Unmatched runs:"]
        for run in unmatched:
            cfg = run["config"]
            moe = {k: v for k, v in (cfg.get("moe") or {}).items() if v is not None}
            lines.append(f"- {run['dir']} (model {cfg.get('model')}, "
                         f"moe overrides {moe or 'none'})")
    if table.get("orderings"):
        lines += ["", "Orderings the paper shows:"]
        marks = {True: "holds", False: "FAILS", None: "untested"}
        for result in (_check(c, table, chosen) for c in table["orderings"]):
            lines.append(f"- [{marks[result['holds']]}] {result['claim']} ({result['detail']})")
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
