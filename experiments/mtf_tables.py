"""Mesh-TensorFlow Tables 2 and 3 in miniature: heads and d_ff scaled together at a fixed d_model.

    python -m switchzoo.data.english --out runs/corpus                        # ~24 MB, once
    python experiments/mtf_tables.py --table lm --out runs/mtf_lm --corpus runs/corpus
    python experiments/mtf_tables.py --table wmt --out runs/mtf_wmt
    python experiments/mtf_tables.py --table lm --out runs/mtf_lm --corpus runs/corpus --report

The paper (Shazeer et al. 2018, arXiv 1811.02084) grows its models by doubling the attention heads
and the FFN width together at d_model 1024: Table 2 (LM1B language models, heads 4 ... 256, word
perplexity falls with each doubling until it saturates) and Table 3 (WMT'14 translation, heads
4 ... 128, BLEU). Here each series has four rungs, heads 1, 2, 4, 8 standing for the paper's
4 ... 32 (models/mtf.py):

    --table lm   mtf_lm_cpu_h{1,2,4,8}   decoder-only, 2 layers, d_model 96, d_kv 24,
                 d_ff = 96 x heads, untied; configs/lm_cpu.py (the Switch paper's recipe) on
                 English prose (python -m switchzoo.data.english), 2,000 steps of 32 x 128 tokens;
                 word perplexity (the LM1B convention) -> configs/tables/mtf_table2_lm1b.py MINI
    --table wmt  mtf_wmt_cpu_h{1,2,4,8}  encoder-decoder, 3+3 layers, d_model 128, d_kv 32,
                 d_ff = 64 x heads, untied; the offline demo's translation config (configs/demo.py)
                 on the shipped English-German pairs, 1,200 steps of 32 x 64 tokens; BLEU (beam
                 search) -> configs/tables/mtf_table3_wmt.py MINI

Runs share one vocabulary (the first run, h1, trains it) and one seed, so they see the same
tokens in the same order. Every run is compared with the rung below it (its baseline). After
training, eval.py evaluates each finished run (results.json), and the paper's table is printed
beside ours with its orderings and margins (``python eval.py --table=mtf_table2_lm1b_mini`` or
``mtf_table3_wmt_mini`` prints it again). Writes --out/h<heads>/ (train.py workdirs; run again to
continue), --out/<name>.json and --out/figures/<name>.png, or with --publish docs/<name>.json
and docs/figures/<name>.png (name: mtf_table2_mini or mtf_table3_mini).

Another seed: every rung at --seed N in its own --out and --name (h1 trains the vocabulary again:
SentencePiece on the same text gives the same one); --seeds-from the other seeds' results
judges each rung against the one below over every seed (``seeds`` in the JSON: the held-out loss
and the table's metric, by switchzoo.noise's paired rule), e.g.

    python experiments/mtf_tables.py --table wmt --out runs/mtf_wmt_s1 --seed 1 \
        --name mtf_table3_mini_s1 --seeds-from docs/mtf_table3_mini.json
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import harness  # noqa: E402
import verdicts  # noqa: E402
from harness import Run  # noqa: E402
from switchzoo import noise  # noqa: E402

HEADS = (1, 2, 4, 8)

SERIES = {
    "lm": dict(
        prefix="mtf_lm_cpu_h", config="configs/lm_cpu.py", steps=2000, eval_every=250,
        name="mtf_table2_mini", table="mtf_table2_lm1b_mini", metric="word_perplexity",
        title="Mesh-TF Table 2, mini: decoder-only LMs on English prose, heads and d_ff x2 per "
              "rung at d_model 96"),
    "wmt": dict(
        prefix="mtf_wmt_cpu_h", config="configs/demo.py", steps=1200, eval_every=300,
        name="mtf_table3_mini", table="mtf_table3_wmt_mini", metric="bleu",
        title="Mesh-TF Table 3, mini: English-German encoder-decoders on the shipped pairs, heads "
              "and d_ff x2 per rung at d_model 128"),
}


def runs(prefix: str, seed: int = 0) -> list[Run]:
    """h1 (trains the vocabulary) ... h8; each compared with the rung below it."""
    return [Run(f"h{h}", f"{prefix}{h}", seed=seed, baseline=f"h{below}" if below else None)
            for h, below in zip(HEADS, (None,) + HEADS[:-1])]


def study(args) -> harness.Study:
    series = SERIES[args.table]
    if args.table == "lm":
        corpus = args.corpus.resolve()
        flags = (f"--config.data.train_files={corpus / 'train.txt'}",
                 f"--config.data.eval_files={corpus / 'eval.txt'}",
                 f"--config.warmup_steps={args.warmup}",
                 f"--config.data.max_eval_examples={args.eval_examples}")
    else:
        flags = (f"--config.data.pair={args.pair}",)
    return harness.Study(
        name=args.name, config=series["config"], runs=runs(series["prefix"], args.seed),
        steps=args.steps,
        eval_every=args.eval_every, title=series["title"], flags=flags)


def command_line(args) -> str:
    line = (f"python experiments/mtf_tables.py --table {args.table} --out {args.out} --steps "
            f"{args.steps} --eval-every {args.eval_every} --name {args.name}")
    if args.runs:
        line += " --runs " + " ".join(args.runs)
    if args.seed:
        line += f" --seed {args.seed}"
    if args.seeds_from:
        line += " --seeds-from " + " ".join(map(str, args.seeds_from))
    if args.table == "lm":
        return (line + f" --corpus {args.corpus} --warmup {args.warmup} --eval-examples "
                       f"{args.eval_examples}")
    return line + f" --pair {args.pair}"


def evaluated(s: harness.Study, out: pathlib.Path) -> list[str]:
    """The run dirs eval.py has evaluated (their results.json), in series order."""
    return [str(out / r.name) for r in s.runs if (out / r.name / "results.json").is_file()]


def table_result(series: dict, dirs: list[str]) -> dict:
    """Ours from each results.json and the table's orderings (switchzoo.tables), with margins."""
    from switchzoo import scores, tables
    ours = {}
    for d in dirs:
        r = scores.read_results(d)
        ours[pathlib.Path(d).name] = {k: r.get(k) for k in (
            "step", "model", series["metric"], "loss", "token_perplexity", "accuracy")}
    return {"name": series["table"], "metric": series["metric"], "results": ours,
            "orderings": tables.check_ordering(series["table"], dirs)}


def by_seed(results: list[dict], name: str, metric: str) -> dict[int, float]:
    """{seed: the table's ``metric``} of rung ``name`` over ``results`` (one per seed)."""
    out = {}
    for res in results:
        value = res.get("table", {}).get("results", {}).get(name, {}).get(metric)
        if name in res["runs"] and value is not None:
            out[res["runs"][name].get("seed", 0)] = value
    return out


def rungs_over_seeds(result: dict, others: list[dict]) -> dict:
    """Each rung against the one below over every seed that ran (this result's and
    ``others``', the same series on other seeds): the held-out loss (verdicts.compare) and the
    table's metric (BLEU: higher is better; word perplexity: lower), each by the paired rule,
    and the metric's mean over the seeds. A rung this result did not train (--runs left it
    out) is judged by the results that hold it, not here."""
    metric = result["table"]["metric"]
    seeded, every = verdicts.with_seeds(result, others), [result, *others]
    out = {}
    for r in runs(""):
        values = by_seed(every, r.name, metric)
        out[r.name] = {f"{metric}_by_seed": {str(k): round(v, 4) for k, v in sorted(
            values.items())}, f"{metric}_mean": round(sum(values.values()) / len(values), 4)
            if values else None}
        if r.baseline and r.name in result["runs"]:
            loss = verdicts.compare(seeded, r.name, r.baseline)
            m = noise.compare(values, by_seed(every, r.baseline, metric),
                              higher_is_better=metric == "bleu")
            out[r.name].update(loss_vs_below=loss, **{
                f"{metric}_vs_below": {**m, "verdict": noise.verdict(m)}})
    return out


def plot(result: dict, path: pathlib.Path) -> None:
    harness.plot_curves(result, path, {result.get("title") or result["study"]:
                                       [r.name for r in runs("")]})


def markdown(result: dict) -> str:
    metric, c = result["table"]["metric"], harness.COLUMNS

    def value(name, r):
        v = result["table"]["results"].get(name, {}).get(metric)
        return None if v is None else f"{v:.4g}"

    def per_step(name, r):
        return f"{r['seconds'] / r['steps'][-1]:.2f}" if r.get("seconds") else None
    return harness.markdown(result, [
        c["run"], c["model"], c["params"], c["tokens"], c["loss"],
        (f"{metric} (eval.py)", value), ("vs the rung below", c["vs_baseline"][1]),
        ("steps to its final loss", c["reach"][1]), ("s/step", per_step)])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--table", choices=sorted(SERIES), required=True,
                   help="lm: Table 2 (word perplexity); wmt: Table 3 (BLEU)")
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--corpus", type=pathlib.Path,
                   help="--table lm: python -m switchzoo.data.english --out CORPUS")
    p.add_argument("--pair", default="en-de", help="--table wmt: the shipped pair")
    p.add_argument("--runs", nargs="+", choices=[f"h{h}" for h in HEADS],
                   help="train only these (and h1, whose vocabulary the others read)")
    p.add_argument("--steps", type=int, help="default: 2,000 (lm) or 1,200 (wmt)")
    p.add_argument("--eval-every", type=int, help="default: 250 (lm) or 300 (wmt)")
    p.add_argument("--warmup", type=int, default=250,
                   help="--table lm: k of the rsqrt schedule (T5's shape; T5's own k is 10000)")
    p.add_argument("--eval-examples", type=int, default=2000, help="--table lm")
    p.add_argument("--name", help="NAME.json, figures/NAME.png in --out (docs/ with --publish; "
                                  "default: mtf_table2_mini or mtf_table3_mini)")
    p.add_argument("--seed", type=int, default=0, help="every rung's seed (give each seed its "
                   "own --out and --name)")
    p.add_argument("--seeds-from", type=pathlib.Path, nargs="+",
                   help="the same series' results on other seeds (their JSON), for the verdicts")
    p.add_argument("--report", action="store_true", help="only evaluate and collect what has run")
    harness.publish_argument(p)
    args = p.parse_args(argv)
    series = SERIES[args.table]
    args.steps = args.steps or series["steps"]
    args.eval_every = args.eval_every or series["eval_every"]
    args.name = args.name or series["name"]
    if args.table == "lm" and harness.missing_corpus(args.corpus):
        return 2
    s = study(args)
    others = verdicts.seeds_from(args.seeds_from, args.seed, s)     # checked before training
    if not args.report:
        harness.run(s, args.out, only=args.runs)
    harness.evaluate(s, args.out)
    result = harness.collect(s, args.out, command_line(args), title=s.title,
                             series=args.table)
    dirs = evaluated(s, args.out)
    result["table"] = table_result(series, dirs)
    if others:
        result["seeds"] = rungs_over_seeds(result, others)
    harness.write(result, args.out, plot, publish=args.publish)
    print(markdown(result))
    from switchzoo import tables
    print()
    print(tables.collect(series["table"], dirs))
    print(json.dumps(result["table"]["orderings"], indent=1))
    if others:
        print(json.dumps(result["seeds"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
