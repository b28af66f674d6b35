"""A learning-rate probe: dense and Switch-8 at a higher rate than configs/lm_cpu.py's 0.01.

    python experiments/lr_probe.py --out runs/lr --corpus runs/corpus --reference runs/rf_lm

Trains dense_lm_cpu and switch_lm_cpu_8 for --steps (1,200) at --lr (0.02), otherwise exactly as
experiments/routing_family.py --regime lm trains its dense and top1 runs (the same recipe,
corpus, vocabulary, seed and data order; the rsqrt schedule, T5's shape with warm-up 250, does
not depend on the total steps, so the reference runs' first --steps are the same runs at 0.01).
--reference is that study's --out: its dense and top1 curves up to --steps are the 0.01 rows,
and its tokenizer is the vocabulary. Writes --out/<run>/ (resumable), --out/lr_probe.json (harness.collect's, with the
reference curves and Switch-minus-dense per step at both rates) and --out/figures/lr_probe.png;
with --publish docs/lr_probe.json and docs/figures/lr_probe.png instead.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import harness  # noqa: E402
import lm_claims  # noqa: E402
from harness import Run  # noqa: E402

REFERENCE = {"dense": ("dense", "dense_lm_cpu"),        # run -> the reference study's run
             "switch_8": ("top1", "switch_lm_cpu_8")}


def curve(workdir: pathlib.Path, steps: int, model: str) -> dict:
    evals = [e for e in harness.rows(workdir, "eval") if e["step"] <= steps]
    losses = [round(e["loss"], 4) for e in evals]
    return {"model": model, "steps": [e["step"] for e in evals], "eval_loss": losses,
            "final_eval_loss": losses[-1]}


def gaps(dense: dict, switch: dict) -> dict:
    at = dict(zip(dense["steps"], dense["eval_loss"]))
    return {s: round(l - at[s], 4) for s, l in zip(switch["steps"], switch["eval_loss"]) if s in at}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--corpus", type=pathlib.Path, required=True)
    p.add_argument("--reference", type=pathlib.Path, required=True,
                   help="routing_family.py --regime lm's --out (its dense and top1 at 0.01)")
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--report", action="store_true", help="only collect what has run")
    harness.publish_argument(p)
    args = p.parse_args(argv)
    if harness.missing_corpus(args.corpus):
        return 2
    vocab = (args.reference / "dense" / "tokenizer.model").resolve()
    missing = [n for n, _ in REFERENCE.values() if not harness.rows(args.reference / n, "eval")]
    if not vocab.is_file() or missing:
        print(f"error: --reference {args.reference} lacks a finished dense/top1 with its "
              "tokenizer; run python experiments/routing_family.py --regime lm --out "
              f"{args.reference} first", file=sys.stderr)
        return 2
    tag = f"lr{args.lr:g}"
    s = harness.Study(
        name="lr_probe", config="configs/lm_cpu.py", steps=args.steps, eval_every=200,
        title=f"dense and Switch-8 at learning rate {args.lr:g}", vocab=vocab,
        runs=[Run(f"dense_{tag}", "dense_lm_cpu", (f"--config.learning_rate={args.lr:g}",)),
              Run(f"switch_8_{tag}", "switch_lm_cpu_8", (f"--config.learning_rate={args.lr:g}",),
                  baseline=f"dense_{tag}")],
        flags=lm_claims.study(argparse.Namespace(
            name="lr_probe", corpus=args.corpus, steps=args.steps, eval_every=200, warmup=250,
            eval_examples=2000)).flags)
    if not args.report:
        harness.run(s, args.out)
    result = harness.collect(s, args.out, harness.command_line("lr_probe.py", args),
                             corpus=lm_claims.corpus_about(args.corpus, vocab))
    reference = {f"{run}_lr0.01": curve(args.reference / source, args.steps, model)
                 for run, (source, model) in REFERENCE.items()}
    result["reference"] = {"study": str(args.reference), "runs": reference}
    ours = {n: {"steps": r["steps"], "eval_loss": r["eval_loss"]}
            for n, r in result["runs"].items()}
    result["switch_minus_dense"] = {
        "lr0.01": gaps(reference["dense_lr0.01"], reference["switch_8_lr0.01"])}
    if len(ours) == 2:
        result["switch_minus_dense"][tag] = gaps(ours[f"dense_{tag}"], ours[f"switch_8_{tag}"])

    def plot(res: dict, path: pathlib.Path) -> None:
        both = dict(res, runs={**res["runs"], **reference})
        harness.plot_curves(both, path, {"learning rate 0.01 vs " + f"{args.lr:g}":
                                         list(both["runs"])})
    harness.write(result, args.out, plot, publish=args.publish)
    print(json.dumps(result["switch_minus_dense"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
