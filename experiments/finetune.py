"""Fine-tuning in miniature (the Switch paper's Tables 4 and 5 on one task this machine has):
movie-review sentiment, pre-trained Switch-8 against its FLOP-matched dense model and against
each trained from scratch, and expert dropout 0.4 against 0.1.

    python -m switchzoo.tasks.movie_reviews --out runs/movie_reviews          # the task, once
    python experiments/span_claims.py --name ft_pretrain --out runs/ft_pre --corpus runs/corpus \
        --steps 3000 --warmup 250 --eval-every 1000 --eval-examples 500 \
        --vocab runs/ft_pre/vocab/tokenizer.model --runs dense_lr0.04          # and, beside it,
        ... --runs switch_8_nojitter_lr0.08       # the span study's recipe at each one's best rate
    python experiments/finetune.py --pretrained runs/ft_pre --task-dir runs/movie_reviews \
        --out runs/finetune      # ~45 min on 2 CPU cores, two processes of --runs side by side
    tail -n +2 runs/movie_reviews/validation.tsv | cut -f1 > runs/mr_validation.txt
    python eval.py --workdir=runs/ft_pre/dense_lr0.04 \
        --config.data.eval_files=$PWD/runs/mr_validation.txt       # and the Switch-8 run: the
        # pre-trained models' span-corruption loss on the task's sentences
    python experiments/finetune.py ... --report [--publish]

Every fine-tune is configs/finetune.py (Adafactor at a constant rate, dropout 0.1, expert
dropout 0.4 unless named, evaluation capacity factor 2.0, greedy decoding of the label) at
--learning-rate (0.01: where these models' pre-training schedule ends, as T5X's 1e-3 is where
T5's ends; a probe of the pre-trained dense model at 0.01 and 0.03 picked it on the validation
split) for --steps steps of 32 packed rows (~4 examples a row), scored on the validation split
every --eval-every steps; the best of those checkpoints is scored once on the test split (what
the table reports). Two seeds
of each fine-tune (data order and dropout; the pre-trained model is one run). Baselines on the
same test split: the majority class of the training split, and VADER's lexicon rule
(SentimentIntensityAnalyzer, compound >= 0.05 positive; pip install vaderSentiment==3.3.2).
Judged by switchzoo.noise's rule over the seeds. Writes OUT/finetune.json and
OUT/figures/finetune.png; with --publish docs/finetune.json and docs/figures/finetune.png.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from switchzoo import atomic, machine, noise  # noqa: E402
from switchzoo.tasks import tables  # noqa: E402

PRETRAINED = {"switch_8": ("switch_sc_cpu_8", "switch_8_nojitter_lr0.08"),
              "dense": ("dense_sc_cpu", "dense_lr0.04")}       # name -> (catalogue, span run)
SEEDS = (0, 1)


def runs() -> dict[str, dict]:
    """{run name: {"model", "pretrained" (a span run or None), "flags", "seed"}}."""
    out = {}
    for seed in SEEDS:
        for name, (model, span) in PRETRAINED.items():
            out[f"{name}_pretrained_s{seed}"] = dict(model=model, pretrained=span, flags=(),
                                                     seed=seed)
            out[f"{name}_scratch_s{seed}"] = dict(model=model, pretrained=None, flags=(),
                                                  seed=seed)
        out[f"switch_8_pretrained_edrop0.1_s{seed}"] = dict(
            model="switch_sc_cpu_8", pretrained=PRETRAINED["switch_8"][1],
            flags=("--config.finetune.expert_dropout=0.1",), seed=seed)
    return out


def command(name: str, run: dict, args) -> list[str]:
    flags = [f"--config=configs/finetune.py:task=movie_reviews,model={run['model']},"
             f"steps={args.steps}", f"--workdir={args.out / name}",
             f"--config.finetune.data_dir={args.task_dir.resolve()}",
             f"--config.eval_every_steps={args.eval_every}",
             f"--config.checkpoint_every_steps={args.eval_every}",
             f"--config.seed={run['seed']}",
             f"--config.learning_rate={args.learning_rate:g}", *run["flags"]]
    if run["pretrained"]:
        flags.append(f"--config.init_from={(args.pretrained / run['pretrained']).resolve()}")
    else:           # from scratch: the pre-trained models' vocabulary, the catalogue's init
        flags.append(f"--config.data.vocab_path={args.vocab.resolve()}")
    return [sys.executable, str(ROOT / "train.py"), *flags]


def train_and_test(name: str, run: dict, args) -> None:
    workdir = args.out / name
    test = workdir / "results-test.json"
    if test.is_file():
        return
    start = time.time()
    subprocess.run(command(name, run, args), check=True, cwd=ROOT)
    subprocess.run([sys.executable, str(ROOT / "eval.py"), f"--workdir={workdir}",
                    "--config.finetune.eval_split=test"], check=True, cwd=ROOT)
    (result,) = workdir.glob("results-test-*.json")
    data = json.loads(result.read_text())
    data["seconds"] = round(time.time() - start, 1)
    atomic.write_text(test, json.dumps(data, indent=1) + "\n")


def baselines(task_dir: pathlib.Path) -> dict:
    """Majority class of the training split and VADER's rule, on the test split."""
    train, test = (tables.read(task_dir / f"{s}.tsv") for s in ("train", "test"))
    labels = [r["label"] for r in train]
    majority = max(set(labels), key=labels.count)
    gold = [r["label"] for r in test]
    out = {"majority": {"class": majority,
                        "accuracy": round(100 * sum(g == majority for g in gold) / len(gold), 3)}}
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
    analyzer = SentimentIntensityAnalyzer()
    vader = ["positive" if analyzer.polarity_scores(r["sentence"])["compound"] >= 0.05
             else "negative" for r in test]
    out["vader"] = {"rule": "compound >= 0.05 positive",
                    "accuracy": round(100 * sum(v == g for v, g in zip(vader, gold))
                                      / len(gold), 3)}
    out["test_examples"] = len(gold)
    return out


def pretraining(directory: pathlib.Path) -> dict:
    """Each pre-trained model's held-out span-corruption loss per evaluation step, and on the
    task's validation sentences (how far the task's text is from the pre-training text:
    eval.py --workdir=RUN --config.data.eval_files=runs/mr_validation.txt, one sentence a
    line)."""
    out = {}
    for name, (model, span) in PRETRAINED.items():
        path = directory / span / "metrics.jsonl"
        if path.is_file():
            out[name] = {"run": span, "model": model, "held_out_loss": {
                r["step"]: round(r["loss"], 4) for r in map(json.loads, path.open())
                if r.get("split") == "eval"}}
            for result in (directory / span).glob("results-mr_validation-*.json"):
                out[name]["movie_review_sentences_loss"] = round(
                    json.loads(result.read_text())["loss"], 4)
    return out


def collect(args) -> dict:
    result = {"runs": {}, "baselines": baselines(args.task_dir), "steps": args.steps,
              "eval_every": args.eval_every, "learning_rate": args.learning_rate,
              "noise_rule": noise.RULE, "pretraining": pretraining(args.pretrained),
              "commit": args.commit,
              "machine": machine.describe()}
    for name, run in runs().items():
        test = args.out / name / "results-test.json"
        if not test.is_file():
            continue
        got = json.loads(test.read_text())
        best = json.loads((args.out / name / "best" / "best.json").read_text())
        curve = [(r["step"], r["tasks"]["movie_reviews"]["accuracy"])
                 for r in map(json.loads, (args.out / name / "metrics.jsonl").open())
                 if r.get("split") == "eval" and "tasks" in r]
        result["runs"][name] = {
            **{k: v for k, v in run.items() if k != "flags"}, "flags": list(run["flags"]),
            "test": got["tasks"]["movie_reviews"], "best_step": best["step"],
            "validation_at_best": best["scores"]["movie_reviews"],
            "validation_curve": curve, "seconds": got.get("seconds")}
    result["comparisons"] = comparisons(result)
    return result


def by_seed(result: dict, stem: str) -> dict[int, float]:
    return {r["seed"]: r["test"]["accuracy"] for n, r in result["runs"].items()
            if n.rsplit("_s", 1)[0] == stem}


def comparisons(result: dict) -> dict:
    """The claims, each a noise.compare of test accuracy (higher is better) over the seeds."""
    pairs = {
        "switch_pretrained_vs_scratch": ("switch_8_pretrained", "switch_8_scratch"),
        "dense_pretrained_vs_scratch": ("dense_pretrained", "dense_scratch"),
        "switch_vs_dense_pretrained": ("switch_8_pretrained", "dense_pretrained"),
        "switch_vs_dense_scratch": ("switch_8_scratch", "dense_scratch"),
        "expert_dropout_0.4_vs_0.1": ("switch_8_pretrained", "switch_8_pretrained_edrop0.1"),
    }
    out = {}
    for key, (a, b) in pairs.items():
        c = noise.compare(by_seed(result, a), by_seed(result, b), higher_is_better=True)
        out[key] = {**c, "runs": [a, b], "verdict": noise.verdict(c)}
    mine = by_seed(result, "switch_8_pretrained")
    for base in ("vader", "majority"):
        value = result["baselines"][base]["accuracy"]
        c = noise.compare(mine, {s: value for s in mine}, higher_is_better=True)
        out[f"switch_pretrained_vs_{base}"] = {**c, "runs": ["switch_8_pretrained", base],
                                               "verdict": noise.verdict(c)}
    return out


def plot(result: dict, path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, run in sorted(result["runs"].items()):
        steps, acc = zip(*run["validation_curve"]) if run["validation_curve"] else ((), ())
        left.plot(steps, acc, label=name, linestyle="-" if run["pretrained"] else "--")
    left.set(xlabel="fine-tuning step", ylabel="validation accuracy (%)",
             title="movie_reviews: validation accuracy while fine-tuning")
    left.legend(fontsize=7)
    stems = sorted({n.rsplit("_s", 1)[0] for n in result["runs"]})
    for i, stem in enumerate(stems):
        values = by_seed(result, stem)
        right.scatter([i] * len(values), list(values.values()), color="C0")
    for base, color in (("vader", "C3"), ("majority", "C7")):
        right.axhline(result["baselines"][base]["accuracy"], color=color, linestyle=":",
                      label=f"{base} ({result['baselines'][base]['accuracy']:.1f})")
    right.set_xticks(range(len(stems)), stems, rotation=30, ha="right", fontsize=7)
    right.set(ylabel="test accuracy (%), best validation checkpoint",
              title="test accuracy per seed")
    right.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pretrained", type=pathlib.Path, default=ROOT / "runs/ft_pre")
    p.add_argument("--vocab", type=pathlib.Path,
                   default=ROOT / "runs/ft_pre/vocab/tokenizer.model")
    p.add_argument("--task-dir", type=pathlib.Path, default=ROOT / "runs/movie_reviews")
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "runs/finetune")
    p.add_argument("--runs", nargs="+", choices=sorted(runs()), default=sorted(runs()))
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--learning-rate", type=float, default=0.01,
                   help="the constant fine-tuning rate of every run (T5X's 1e-3 is where T5's "
                        "524k-step pre-training ends; these models' 3,000 steps end near 0.01)")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--report", action="store_true", help="only collect what has run")
    p.add_argument("--commit", default=subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
        text=True).stdout.strip(), help="the commit the runs trained with (default: HEAD)")
    p.add_argument("--publish", action="store_true", help="write docs/finetune.json and "
                                                          "docs/figures/finetune.png")
    args = p.parse_args(argv)
    if not (args.task_dir / "train.tsv").is_file():
        print(f"error: no {args.task_dir}/train.tsv; python -m switchzoo.tasks.movie_reviews "
              f"--out {args.task_dir}", file=sys.stderr)
        return 2
    if not args.report:
        for name in args.runs:
            train_and_test(name, runs()[name], args)
    result = collect(args)
    where = ROOT / "docs" if args.publish else args.out
    atomic.write_text(where / "finetune.json", json.dumps(result, indent=1) + "\n")
    plot(result, where / "figures" / "finetune.png")
    if args.publish:
        import orderings                  # the table of every published verdict, kept fresh
        print(f"wrote {orderings.write(ROOT / 'docs')}")
    for key, c in result["comparisons"].items():
        print(f"{key:34} margin {c['margin']} noise {c['noise']} -> {c['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
