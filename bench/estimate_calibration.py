"""The layout search's memory estimate against the compiles it has on record: every compiled row
of the search results in docs/bench/layout_search/*.json, estimated again by today's
switchzoo/planner/estimate.py and divided into the peak XLA reported when the row was compiled.

No compile here (seconds on one CPU): each file's run is rebuilt from what its JSON records
(model, devices, global batch, input length, dtype, remat, optimizer; configs/c4.py for an
encoder-decoder, configs/lm1b.py for a decoder-only model, as the search's default task), each
row's mesh and layout parsed as an --include, a pipelined row with its own micro-batches and
rounds. What the JSON does not record is assumed to be the default (--grad-accum, --group-size,
a --config variant, scanned layers); a file whose rebuilt run gives other token lengths than its
JSON records, or a row that does not parse, is skipped and said so. The compiled peaks are those of the commit that compiled them (the JSON's rows carry
no commit: a program changed since, e.g. a pipeline's, is read as it was); XLA:CPU's, which
holds float32 where a TPU or GPU keeps bfloat16 in places.

    python bench/estimate_calibration.py [--out F]
"""
import glob
import math
import pathlib
import statistics
import sys

from common import emit, machine, parser

ROOT = pathlib.Path(__file__).resolve().parents[1]


def rows_of(path: pathlib.Path) -> tuple[list[dict], str | None]:
    """(one record per compiled row of the search result at ``path``, why it was skipped)."""
    import json

    from switchzoo import state as state_lib, zoo
    from switchzoo.planner import command, search
    from switchzoo.planner.from_config import analytic_model
    result = json.loads(path.read_text())
    rows = [r for r in result.get("rows", []) if r.get("peak_bytes")]
    if not rows:
        return [], "no compiled rows"
    task = "configs/c4.py" if zoo.get(result["model"]).is_encoder_decoder else "configs/lm1b.py"
    n = result["devices"]
    args = command.parser().parse_args([
        "--model", result["model"], "--devices", str(n), "--hardware", result["hardware"],
        "--config", task, "--batch", str(result["batch"]), "--length", str(result["lengths"][0]),
        "--dtype", result["dtype"], "--remat", result["remat"], "--optimizer",
        result["optimizer"], "--axes", "stage,data,model,expert"])
    config = command.config_from_args(args)
    cfg = search.run_model(config)
    optimizer = state_lib.run_optimizer(config)
    out, models = [], {}
    for r in rows:
        pipe = (r.get("microbatches") or None, r.get("repeats", 1))
        if pipe not in models:           # the estimate's model of the run, per schedule
            models[pipe] = analytic_model(config, cfg, optimizer, n, *pipe)
        model = models[pipe]
        if list(model.lengths) != list(result["lengths"]):
            return [], f"rebuilt lengths {model.lengths}, recorded {result['lengths']}"
        text = f"{r['mesh']}/{r['layout']}"
        mesh_axes = tuple(x.split(":")[0] for x in r["mesh"].split(","))
        try:
            c = search._pipelined_include(text, search.parse_include(text, mesh_axes, n), model)
        except ValueError as e:
            return out, f"{text}: {e}"
        estimate = model.state_bytes(c) + model.activation_bytes(c)
        out.append({"file": path.name, "model": result["model"], "devices": n,
                    "hardware": result["hardware"], "batch": result["batch"],
                    "lengths": result["lengths"], "mesh": r["mesh"], "layout": r["layout"],
                    "stages": r.get("stages", 1), "microbatches": r.get("microbatches", 0),
                    "repeats": r.get("repeats", 1),
                    "compiled_peak_bytes": r["peak_bytes"],
                    "recorded_estimate_bytes": r.get("estimated_peak_bytes"),
                    "estimate_bytes": estimate,
                    "compiled_over_estimate": round(r["peak_bytes"] / estimate, 3)})
    return out, None


def main():
    p = parser(__doc__)
    p.add_argument("--results", default=str(ROOT / "docs/bench/layout_search/*.json"),
                   help="glob of search results (--json output) to read")
    args = p.parse_args()
    rows, skipped = [], {}
    for path in sorted(glob.glob(args.results)):
        got, why = rows_of(pathlib.Path(path))
        rows += got
        if why:
            skipped[pathlib.Path(path).name] = why
    # a row compiled twice (a file that repeats another's candidates) counts once
    unique = {(r["model"], r["devices"], r["batch"], tuple(r["lengths"]), r["mesh"], r["layout"],
               r["microbatches"], r["repeats"]): r for r in rows}
    ratios = [r["compiled_over_estimate"] for r in unique.values()]
    by_stages = {}
    for r in unique.values():
        by_stages.setdefault("pipelined" if r["stages"] > 1 else "unpipelined", []).append(
            r["compiled_over_estimate"])

    def summary(xs):
        return {"rows": len(xs), "min": min(xs), "median": statistics.median(xs), "max": max(xs),
                "geometric_mean": round(math.exp(statistics.fmean(map(math.log, xs))), 3)}
    # rows compiled with today's estimate: the rebuild gives the estimate they recorded
    same = [r for r in unique.values() if r["recorded_estimate_bytes"] is not None
            and abs(r["estimate_bytes"] - r["recorded_estimate_bytes"]) < 1]
    result = {"machine": machine(), "rows": rows, "skipped": skipped,
              "distinct_rows": len(unique),
              "distinct_rows_whose_recorded_estimate_is_todays": len(same),
              "compiled_over_estimate": summary(ratios) if ratios else None,
              "by_kind": {k: summary(v) for k, v in sorted(by_stages.items())}}
    for r in rows:
        print(f"{r['file'][:36]:36s} {r['mesh']:34s} S={r['stages']} estimate "
              f"{r['estimate_bytes'] / 1e9:7.2f} GB compiled {r['compiled_peak_bytes'] / 1e9:7.2f}"
              f" GB  x{r['compiled_over_estimate']:.3f}", file=sys.stderr)
    emit(result, args.out)


if __name__ == "__main__":
    main()
