"""The Switch paper's Table 3 on this CPU (issue 24): 0.1x vs 1.0x initialisation.

    python experiments/paper_recipe.py --study init --out runs/recipe     # ~30 min, 2 cores
    python experiments/paper_recipe.py --study init --out runs/recipe --report

init: Switch sec. 2.4 / Table 3: 32 experts, 3 seeds, early in training, every weight matrix
from a truncated normal of std sqrt(s / fan-in), s = 0.1 against s = 1.0 (the paper: neg. log
perplexity -2.72 +- 0.01 against -3.60 +- 0.68 after 3.5k steps). Here: switch_cpu_32, span
corruption on experiments/english_text.py's text, configs/c4.py's recipe at CPU scale
(experiments/switch_vs_dense.py's flags), --init-steps steps per run.

Whether the router learns (router_confidence / router_entropy / router_logit_std over the
steps, and router_learning_rate_scale) is read off experiments/switch_vs_dense.py's runs.

Runs go through experiments/harness.py: train.py workdirs under --out (resumable: a finished
run is skipped; a one-step run "vocab" trains the vocabulary every run reads; each finished run
evaluated by eval.py); results go to --out/paper_recipe_<study>.json (harness.collect's, with
the summary against Table 3) and --out/figures/paper_recipe_<study>.png, or with --publish to
docs/paper_recipe.json and docs/figures/paper_recipe_<study>.png.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import harness  # noqa: E402
from harness import Run  # noqa: E402
from switch_vs_dense import english_docs, recipe_arguments, span_study  # noqa: E402

PAPER_TABLE3 = {"0.1": (-2.72, 0.01), "1.0": (-3.60, 0.68)}   # Switch paper Table 3
SCALES = ("0.1", "1.0")
VOCAB = Run("vocab", "t5_cpu", steps=1, report=False)    # one vocabulary for all


def init_runs(seeds) -> list[Run]:
    """Table 3: switch_cpu_32 from a truncated normal of std sqrt(s / fan-in), per seed."""
    return [VOCAB] + [Run(f"init{s}_seed{seed}", "switch_cpu_32", (
        f"--config.init_scale={s}", "--config.init_distribution=truncated_normal"), seed=seed)
        for s in SCALES for seed in seeds]


RUNS = init_runs((0, 1, 2))


def summary(result: dict) -> dict:
    """Per init scale: the final neg. log perplexity of each seed, their mean and std, and the
    paper's."""
    out = {}
    for s in SCALES:
        final = [-r["final_eval_loss"] for n, r in result["runs"].items()
                 if n.startswith(f"init{s}_")]
        if final:
            out[s] = {"final_neg_log_perplexity": final, "mean": round(statistics.mean(final), 4),
                      "std": round(statistics.stdev(final), 4) if len(final) > 1 else None,
                      "paper_mean_std": PAPER_TABLE3[s]}
    return out


def plot(result: dict, path: pathlib.Path) -> None:
    harness.plot_curves(result, path, {
        f"Switch Table 3 on CPU: switch_cpu_32, {s}x init, one curve per seed":
            [n for n in result["runs"] if n.startswith(f"init{s}_")] for s in SCALES},
        ylabel="held-out loss (nats per target token, lower is better)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--study", choices=("init",), required=True)
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--init-steps", type=int, default=600)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="init study")
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--report", action="store_true", help="only collect what has run")
    recipe_arguments(p)
    p.set_defaults(eval_examples=500)
    harness.publish_argument(p)
    p.add_argument("--json", type=pathlib.Path, help="default: paper_recipe_<study>.json in "
                   "--out, or docs/paper_recipe.json with --publish")
    p.add_argument("--figure", type=pathlib.Path,
                   help="default: figures/paper_recipe_<study>.png beside the JSON")
    args = p.parse_args(argv)
    line = harness.command_line("paper_recipe.py", args)
    args.out = args.out.resolve()
    docs, corpus = english_docs(args.out, write=not args.report)
    s = span_study(args, f"paper_recipe_{args.study}", init_runs(args.seeds), docs,
                   steps=args.init_steps, title="Switch Table 3 (initialisation) on CPU")
    if not args.report:
        harness.run(s, args.out)
        harness.evaluate(s, args.out)
    result = harness.collect(s, args.out, line, corpus=corpus)
    result["summary"] = summary(result)
    path = args.json or (harness.DOCS / "paper_recipe.json" if args.publish else None)
    harness.write(result, args.out, plot, publish=args.publish, path=path, figure=args.figure)
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
