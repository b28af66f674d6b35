"""Switch vs dense on the paper's own task: span corruption on lm_claims' prose, at its budget.

    python experiments/span_claims.py --out runs/span --corpus runs/corpus \
        --vocab runs/lm/dense/tokenizer.model                # ~1 h on 2 CPU cores; resumable
    python experiments/span_claims.py ... --report

experiments/lm_claims.py found Switch ahead of dense on a decoder-only LM at ~20 tokens per dense
non-embedding parameter. This asks the same question of an encoder-decoder trained by T5's span
corruption (noise 0.15, mean span 3: the Switch paper's pre-training task) on the same corpus and
vocabulary, with the same recipe (configs/c4_cpu.py: configs/c4.py's Adafactor per expert, the
rsqrt schedule in T5's shape with warm-up --warmup (250; T5's own is --warmup 10000), 0.1x
truncated-normal init, no dropout, aux loss 0.01, capacity 1.25 / 2.0):

    dense       dense_sc_cpu      d_model 96, 2+2 layers, ReLU FFN 384, tied; 518k non-embedding
    switch_8    switch_sc_cpu_8   the second FFN of each stack a top-1 Switch layer, 8 experts
    dense_s1, switch_8_s1         the same at seed 1 (initialisation and data order), for noise

and the variants experiments/span_runs.py defines, each trained only when named in --runs: the
encoder's router changes, dense and no-jitter Switch-8 at rates 0.02-0.08, one Switch layer in
one stack, dense with Switch-8's parameters, the gate held at 1, the 0.04 pair at 4x the batch
(the same tokens in a quarter of the steps, at 2,400 and 12,000 steps' budgets, at 0.04 and
0.08), the experts' (or, for dense, every) update averaged over steps, Switch with 2 or 4
experts, and Switch-8 with its routers frozen from step 4,000.

32 packed examples per step of 128 input and 29 target positions: at --steps 2400 that is ~12M
encoder + decoder positions (~23 per dense non-embedding parameter; ~1.7 epochs of the text), of
which ~2.2M are supervised targets. The loss is per target token (span corruption's), so it is not
comparable with the LM's. Writes --out/<run>/, --out/span_claims.json and
--out/figures/span_claims.png; with --publish docs/span_claims.json and
docs/figures/span_claims.png (the published result) instead.

The readers that judge each family of runs are experiments/span_effects.py's.
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
import plots  # noqa: E402
import span_effects  # noqa: E402
from span_runs import (  # noqa: E402
    ALL, BATCH, BATCH_SEEDS, BATCHED, BATCHED_LONG, BATCHED_SCALED, BIAS, BUDGETS, DENSE_MOMENTUM,
    EXPERT_MOMENTUM, FEWER, FEWER_EXPERTS, FREEZE_STEP, FROZEN, GATE, INPUTS, MOMENTUM, ONE_STACK,
    RATES, ROUTER, RUNS, SCALED_RATE, TARGETS, WIDE, WIDER, batch_study, batched, rated)


def study(args) -> harness.Study:
    corpus = pathlib.Path(args.corpus).resolve()
    return harness.Study(
        name=args.name, config="configs/c4_cpu.py",
        runs=ALL, steps=args.steps,
        eval_every=args.eval_every, title="Switch vs dense, span corruption on English prose",
        vocab=None if args.vocab is None else args.vocab.resolve(),
        flags=(f"--config.per_device_batch_size={BATCH}", "--config.data.source=files",
               f"--config.data.train_files={corpus / 'train.txt'}",
               f"--config.data.eval_files={corpus / 'eval.txt'}",
               f"--config.warmup_steps={args.warmup}",
               f"--config.data.max_eval_examples={args.eval_examples}"))


def beside_the_pair(result: dict, variants) -> list[str]:
    """The runs of ``variants`` that ran, each after dense and no-jitter Switch-8 at 0.04 of
    its seed (each name once)."""
    names = (n for r in variants if r.name in result["runs"]
             for n in (*(p.name for p in rated(0.04, r.seed)), r.name))
    return list(dict.fromkeys(n for n in names if n in result["runs"]))


def plot(result: dict, path: pathlib.Path) -> None:
    seeds = len({run.get("seed") for run in result["runs"].values()})
    title = f"span corruption: dense vs Switch-8, {seeds} seed{'s' if seeds > 1 else ''}"
    def ran(variants):
        return [r.name for r in variants if r.name in result["runs"]]
    panels = {title: [r.name for r in RUNS]}
    for label, lead, names in (
            ("the encoder's router: one change each to switch_8", ["dense", "switch_8"],
             ran(ROUTER)),
            ("by learning rate: dense and no-jitter Switch-8", ["dense", "switch_8_nojitter"],
             ran(RATES)),
            (f"0.04 at {WIDER}x the batch, a quarter of the steps", [], ran(BATCHED)),
            ("one Switch layer: in the decoder alone or the encoder alone, 0.04", [],
             beside_the_pair(result, ONE_STACK)),
            ("dense with Switch-8's parameters (dense_wide), 0.04", [],
             beside_the_pair(result, WIDE)),
            ("Switch-8 with its gate's value held at 1 (unitgate), 0.04", [],
             beside_the_pair(result, GATE)),
            (f"updates averaged (decay {EXPERT_MOMENTUM:g}): Switch-8's experts', dense's all",
             [], beside_the_pair(result, MOMENTUM + DENSE_MOMENTUM)),
            (f"fewer experts ({', '.join(map(str, FEWER_EXPERTS))}), each more of the tokens, "
             "0.04", [], beside_the_pair(result, FEWER)),
            (f"routers frozen from step {FREEZE_STEP:,} (frozen{FREEZE_STEP // 1000}k), 0.04",
             [], beside_the_pair(result, FROZEN)),
            ("balanced by a bias on the choice, no auxiliary loss (bias), 0.04", [],
             beside_the_pair(result, BIAS)),
            # last: its steps are of 128 examples
            (f"the long pair at {WIDER}x the batch, 3,000 steps, 0.04 and {SCALED_RATE:g}", [],
             ran(BATCHED_LONG + BATCHED_SCALED))):
        if names:
            panels[label] = lead + names
    harness.plot_curves(result, path, panels)
    pairs = {n: c for n, c in result.get("train_and_held_out", {}).items()
             if n.startswith("switch_8_nojitter")}      # the one-stack runs: in the JSON only
    if pairs:                               # figures/<study>_train_held_out.png
        plots.plot_train_and_held_out(pairs,
                                      path.with_name(path.stem + "_train_held_out.png"),
                                      title="Switch minus dense of its seed, span corruption, "
                                            "0.04")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    lm_claims.arguments(p, "span_claims", ALL,
                        [r.name for r in RUNS])
    p.add_argument("--vocab", type=pathlib.Path, default=None,
                   help="lm_claims' tokenizer.model (runs/lm/dense/tokenizer.model), so both "
                        "studies read one vocabulary; without it the first run trains one")
    args = p.parse_args(argv)
    if harness.missing_corpus(args.corpus):
        return 2
    if args.vocab is not None and not args.vocab.is_file():
        print(f"error: --vocab {args.vocab} is not a file; pass lm_claims' "
              "runs/lm/dense/tokenizer.model, or leave --vocab out to train one",
              file=sys.stderr)
        return 2
    s = study(args)
    for budget in BUDGETS:
        named = sorted(set(args.runs) & {r.name for seed in BATCH_SEEDS[budget]
                                         for rate in (0.04, SCALED_RATE)
                                         for r in batched(seed, budget, rate)})
        steps, warmup, every = batch_study(budget)
        if named and not args.report and ((args.steps, args.warmup) != (steps, warmup)
                                          or every not in (None, args.eval_every)):
            flags = f"--steps {steps} --warmup {warmup}" + (f" --eval-every {every}" * bool(every))
            print(f"error: --runs {named}: the 4x-batch pair is the {steps:,}-step study's "
                  f"({steps // WIDER} steps, warm-up {warmup // WIDER}); run it with {flags}, not "
                  f"--steps {args.steps} --warmup {args.warmup} --eval-every {args.eval_every}",
                  file=sys.stderr)
            return 2
    if not args.report:
        harness.run(s, args.out, only=args.runs)
    harness.evaluate(s, args.out)
    tokenizer = s.vocab or args.out / RUNS[0].name / "tokenizer.model"
    result = harness.collect(s, args.out, harness.command_line("span_claims.py", args),
                             corpus=lm_claims.corpus_about(args.corpus, tokenizer))
    dense = result["runs"].get("dense")
    if dense:
        from switchzoo import zoo
        model = zoo.get("dense_sc_cpu")
        non_embedding = dense["parameters"] - model.vocab_size * model.d_model
        positions = dense["train_steps"] * BATCH * (INPUTS + TARGETS)
        result["dense_non_embedding_parameters"] = non_embedding
        result["encoder_decoder_positions_per_run"] = positions
        result["positions_per_dense_non_embedding_parameter"] = round(positions / non_embedding,
                                                                      1)
        result["supervised_target_tokens_per_run"] = dense["tokens_seen"]
    result["claims"] = lm_claims.claims(result)
    effects = span_effects.effects(result)
    result.update(effects)
    harness.write(result, args.out, plot, publish=args.publish)
    print(lm_claims.markdown(result))
    print(json.dumps({"claims": result["claims"], **effects}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
