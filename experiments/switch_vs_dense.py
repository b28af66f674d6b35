"""Does Switch learn faster than a FLOP-matched dense model? Span corruption on real English text.

    python experiments/switch_vs_dense.py --out runs/svd          # ~1 h on a 2-core CPU
    python experiments/switch_vs_dense.py --out runs/svd --report # JSON + plot from what ran

The Switch paper's claim (Fedus et al. 2021, Figure 4 / Table 1): at equal FLOPs per token a
Switch model reaches a dense model's quality in fewer steps, and more experts do better. Here,
on this machine's English text (experiments/english_text.py: gettext messages and GNU manuals),
every run trains with configs/c4.py's recipe scaled to a CPU (Adafactor + rsqrt, no dropout,
aux loss 0.01, inputs 128 / targets 29, 8 sequences per step) for the same steps, from the same
seed, on the same data order, and is evaluated every --eval-every steps on the same held-out
documents (eval capacity factor 2.0):

    dense        t5_cpu          d_model 128, 4+4 layers, ReLU FFN 512
    switch_8     switch_cpu_8    the same with every other FFN a top-1 Switch layer (cf 1.25)
    switch_16    switch_cpu_16
    switch_32    switch_cpu_32
    moe_top2_8   switch_cpu_8, top-2 at capacity factor 1.25 (Table 1's MoE-Base: the same
                 expert slots as top-1, so at most 1.25 served picks per token)

Runs through experiments/harness.py: writes --out/<run>/ (train.py workdirs, resumable; each
finished run evaluated by eval.py, as python -m switchzoo.tables reads runs),
--out/switch_vs_dense.json (harness.collect's: curves, the step at which each run first reaches
its baseline's final eval loss, expert loads and router diagnostics, the machine and commit),
--out/figures/switch_vs_dense.png and --out/figures/switch_vs_dense_router.png; with --publish
the same names under docs/ (the published result). The span-corruption
studies (experiments/routing_family.py, experiments/paper_recipe.py) share this text and recipe
(english_docs, recipe_arguments, span_study).
"""
from __future__ import annotations

import argparse
import hashlib
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import harness  # noqa: E402
from harness import Run  # noqa: E402

ADAMW = ("--config.optimizer=adamw", "--config.learning_rate=0.003")
TOP2 = ("--config.moe.top_k=2",)
CF1 = ("--config.moe.train_capacity_factor=1.0",)
RUNS = [   # in the order they run; each compared with its baseline
    Run("dense", "t5_cpu", baseline="dense"),
    Run("switch_8", "switch_cpu_8", baseline="dense"),
    Run("switch_16", "switch_cpu_16", baseline="dense"),
    Run("switch_32", "switch_cpu_32", baseline="dense"),
    Run("moe_top2_8", "switch_cpu_8", TOP2, baseline="dense"),
    # Table 1's capacity 1.0 rows (span corruption; the mini table now reads lm_claims.py)
    Run("switch_8_cf1.0", "switch_cpu_8", CF1, baseline="dense"),
    Run("moe_top2_8_cf1.0", "switch_cpu_8", TOP2 + CF1, baseline="dense"),
    # issue 24: the router's updates x10 (router_learning_rate_scale), beside switch_8_cf1.0
    Run("switch_8_cf1.0_router10", "switch_cpu_8",
        CF1 + ("--config.router_learning_rate_scale=10",), baseline="dense"),
    # diagnosis: the same pair under AdamW, whose update does not scale with the parameter's
    # size as Adafactor's does (the router starts small)
    Run("dense_adamw", "t5_cpu", ADAMW, baseline="dense_adamw"),
    Run("switch_8_adamw", "switch_cpu_8", ADAMW, baseline="dense_adamw"),
]
MAIN = ["dense", "switch_8", "switch_16", "switch_32", "moe_top2_8"]


def recipe_arguments(p: argparse.ArgumentParser) -> None:
    """The CPU-scaled recipe every experiment on this text shares (besides steps and evals)."""
    p.add_argument("--eval-examples", type=int, default=1000)
    p.add_argument("--length", type=int, default=128, help="inputs; targets follow")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--vocab", type=int, default=4000, help="SentencePiece pieces (+100 ids)")


def span_study(args, name: str, runs: list[Run], docs: pathlib.Path, steps: int | None = None,
               title: str = "") -> harness.Study:
    """A span-corruption study on ``docs``: configs/c4.py's recipe scaled to a CPU by
    recipe_arguments (the first run trains the vocabulary; checkpoints every 4 evaluations)."""
    return harness.Study(
        name=name, config="configs/c4.py", runs=runs, steps=steps or args.steps,
        eval_every=args.eval_every, checkpoint_every=4 * args.eval_every, title=title,
        flags=("--config.data.source=files", f"--config.data.train_files={docs}",
               "--config.layout=data_parallel", "--config.mesh=",
               f"--config.max_length={args.length}",
               f"--config.per_device_batch_size={args.batch}",
               f"--config.warmup_steps={args.warmup}",
               f"--config.data.max_eval_examples={args.eval_examples}",
               f"--config.data.vocab_size={args.vocab}"))


def english_docs(out: pathlib.Path, write: bool = True) -> tuple[pathlib.Path, dict]:
    """out/docs.txt (experiments/english_text.py, written once: resumed runs read the same)
    and a description of it for the results ({} where it is not there)."""
    import english_text
    docs = out / "docs.txt"
    if write and not docs.is_file():
        out.mkdir(parents=True, exist_ok=True)
        texts, _ = english_text.documents(pathlib.Path("/usr/share/info"))
        docs.write_text("".join(t.replace("\n", " ") + "\n" for t in texts), encoding="utf-8")
    if not docs.is_file():
        return docs, {}
    text = docs.read_text(encoding="utf-8")
    return docs, {"file": "docs.txt (experiments/english_text.py)",
                  "documents": text.count("\n"), "characters": len(text),
                  "sha1": hashlib.sha1(text.encode()).hexdigest(),
                  "info_node_header_lines": sum(line.startswith("File: ")
                                                for line in text.splitlines())}


def plot(result: dict, path: pathlib.Path) -> None:
    """The curves, Adafactor's runs beside AdamW's, and the routers' (<figure>_router.png)."""
    harness.plot_curves(result, path, {
        "span corruption, English text, CPU: Adafactor (the paper's recipe)":
            [n for n in result["runs"] if "adamw" not in n],
        "AdamW (diagnosis)": ["dense_adamw", "switch_8_adamw"]},
        ylabel="held-out loss (nats per target token, lower is better)")
    harness.plot_router_curves(result, path.with_name(path.stem + "_router.png"))


def markdown(result: dict) -> str:
    """The results as the Markdown table docs/studies/switch-vs-dense-span.md shows."""
    c = harness.COLUMNS
    return harness.markdown(result, [
        c["run"], c["model"], ("eval neg. log perp. @ last step (↑)", c["neg_log_perp"][1]),
        ("vs its baseline", lambda n, r: harness.signed(r.get("eval_loss_minus_baseline"), -1)),
        ("steps to its baseline's final loss", c["reach"][1]), c["accuracy"], c["train_ce"],
        ("router confidence per Switch layer", lambda n, r: r.get("router_confidence_train")),
        c["load"]])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--runs", nargs="+", default=MAIN, choices=[r.name for r in RUNS])
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--eval-every", type=int, default=250)
    recipe_arguments(p)
    p.add_argument("--report", action="store_true", help="only collect what has run")
    harness.publish_argument(p)
    p.add_argument("--json", type=pathlib.Path, help="the results (its stem names the study; "
                   "default: switch_vs_dense.json in --out, or in docs/ with --publish)")
    p.add_argument("--figure", type=pathlib.Path,
                   help="default: figures/switch_vs_dense.png beside the JSON's default")
    args = p.parse_args(argv)
    line = harness.command_line("switch_vs_dense.py", args)
    args.out = args.out.resolve()
    docs, corpus = english_docs(args.out, write=not args.report)
    s = span_study(args, args.json.stem if args.json else "switch_vs_dense", RUNS, docs,
                   title="Switch vs FLOP-matched dense, span corruption on English text")
    if not args.report:
        harness.run(s, args.out, only=args.runs)
        harness.evaluate(s, args.out)
    result = harness.collect(s, args.out, line, corpus=corpus)
    harness.write(result, args.out, plot, publish=args.publish, path=args.json,
                  figure=args.figure)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
