"""bench/peer.py several times, each a fresh process, thread settings alternating: the median,
min and max of each ratio, with the commit, the load and every run's JSON.

    python bench/peer_series.py [--runs 3] [--threads 2,1] [--out f.json] [-- peer.py flags]

A figure that someone else should reproduce from a clean tree is a median of several runs on an
idle machine, not the best of one: this is the command behind docs/benchmarks.md's peer table.
Runs alternate (2, 1, 2, 1, ...) so that both thread settings see the same drift in load.
``--env NAME=VALUE`` runs every process with that variable (e.g. GLIBC_TUNABLES).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import emit, parser, source

HERE = Path(__file__).resolve().parent
RATIOS = ("train_tokens_per_s_over_transformers", "decode_tokens_per_s_over_transformers")


def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "runs": [round(v, 3) for v in values]}


def summarise(runs: list[dict]) -> dict:
    """Per thread count: each ratio's spread, each side's train and decode speed."""
    out = {}
    for threads in sorted({r["threads"] for r in runs}, reverse=True):
        mine = [r for r in runs if r["threads"] == threads]
        row = {k: spread([r["goals"][k]["value"] for r in mine]) for k in RATIOS}
        for side in ("switchzoo", "transformers"):
            row[side] = {
                "train_tokens_per_s": spread([r[side]["train_tokens_per_s"] for r in mine]),
                "decode_per_further_token_ms": spread(
                    [r[side]["decode_split"]["per_further_token_step_ms"] for r in mine]),
                "decode_encoder_and_first_token_s": spread(
                    [r[side]["decode_split"]["encoder_and_first_token_s"] for r in mine])}
        row["load_average_1min_at_start"] = [r["load_average_1min"]["start"] for r in mine]
        row["correct"] = all(r["correctness"]["ok"] for r in mine)
        out[str(threads)] = row
    return out


def goals(by_threads: dict) -> dict:
    """peer.py's goals, judged on each thread setting's median."""
    from peer import DECODE_GOAL, TRAIN_GOAL
    out = {}
    for threads, row in by_threads.items():
        for key, goal in zip(RATIOS, (TRAIN_GOAL, DECODE_GOAL)):
            value = row[key]["median"]
            out[f"{key}_{threads}_threads_median"] = {"value": value, "goal": f">= {goal}",
                                                      "met": value >= goal}
    return out


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=3, help="runs per thread setting")
    p.add_argument("--threads", default="2,1", help="thread settings, alternated")
    p.add_argument("--env", action="append", default=[], help="NAME=VALUE for every run")
    args, peer_args = p.parse_known_args(argv)
    peer_args = [a for a in peer_args if a != "--"]
    env = dict(os.environ)
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep:
            sys.exit(f"error: --env {item!r}: give NAME=VALUE")
        env[name] = value
    settings = [int(t) for t in args.threads.split(",") if t]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for threads in settings:
                out = Path(tmp) / f"run{i}_{threads}.json"
                cmd = [sys.executable, str(HERE / "peer.py"), "--threads", str(threads),
                       "--out", str(out), *peer_args]
                done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True)
                if not out.exists():
                    sys.exit(f"error: {' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
                runs.append(json.loads(out.read_text()))
                print(f"run {i + 1}/{args.runs}, {threads} thread(s): train "
                      f"{runs[-1]['goals'][RATIOS[0]]['value']}, decode "
                      f"{runs[-1]['goals'][RATIOS[1]]['value']}", file=sys.stderr)
    result = {"benchmark": "peer series: bench/peer.py in fresh processes, alternating threads",
              "source": source(), "env": {k: env[k] for k in map(lambda s: s.split("=")[0],
                                                                 args.env)},
              "peer_flags": peer_args, "machine": runs[0]["machine"],
              "config": runs[0]["config"], "by_threads": summarise(runs), "runs": runs}
    result["goals"] = goals(result["by_threads"])
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
