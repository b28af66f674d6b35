"""The routing family and model surgery, measured: span corruption on real English text.

    python experiments/routing_family.py --out runs/rf            # ~1 h on a 2-core CPU
    python experiments/routing_family.py --out runs/rf --report   # JSON + plot from what ran

Every run trains with experiments/switch_vs_dense.py's recipe (configs/c4.py scaled to a CPU:
Adafactor + rsqrt, no dropout, inputs 128 / targets 29, 8 sequences per step, one vocabulary,
the same seed and data order) on the same English text, evaluated every --eval-every steps on the
same held-out documents. Four questions:

  (a) routers at equal capacity factor 1.25 (switch_cpu_8: every other FFN 8 experts):
      top1 (Switch), top2 (GShard: the same N x 1.25 slots for its 2N picks, so at most 1.25
      served a token), ec (experts-choose in the encoder, tokens-choose top-1 in the decoder,
      as flaxformer: C = N x 1.25 / E per expert), ec_cf2 (experts-choose at capacity 2.0: two
      experts a token, what top-2 would serve with room for every pick)
  (b) balancing: top1 (aux loss 0.01) vs bias (DeepSeek-V3's loss-free bias, no aux loss)
  (c) sparse upcycling: the dense model at --steps/2 is upcycled to switch_cpu_8 (every
      expert = its layer's dense MLP, gates renormalised so that it starts as the dense model)
      and trained --steps/2 more; dense_cont continues the same dense checkpoint as dense for
      as many steps. Both start a fresh optimizer and the same fresh schedule
      (--continue-warmup), so upcycling is the only difference. upcycled_raw: the same
      checkpoint with the raw router probabilities as gates (moe.gates_sum_to_one=false: each
      Switch layer starts scaled by ~1/E), the upcycling of switchzoo before issue 24.
  (d) distillation (Switch paper sec. 4.2): a dense t5_cpu student initialised from the top1
      teacher's non-expert weights and trained on 0.25 x the teacher's probabilities + 0.75 x
      the labels (student), the same initialisation without the teacher's probabilities
      (student_init), vs dense from scratch; share of the teacher's gain kept =
      (dense loss - student loss) / (dense loss - teacher loss).

Runs through experiments/harness.py (the special starts are Run.before hooks): writes
--out/<run>/ (train.py workdirs, resumable; each finished run evaluated by eval.py),
--out/routing_family.json (harness.collect's, with the findings) and
--out/figures/routing_family.png; --publish writes them to docs/ (the published result).

--regime lm asks (c) and (d) in experiments/lm_claims.py's regime instead (run from the repo root):

    python experiments/routing_family.py --regime lm --corpus runs/corpus --out runs/rf_lm \
        --reuse runs/lm                     # then again with --report

a decoder-only LM on the English prose corpus with configs/lm_cpu.py (the paper's recipe), its
defaults (--steps 2400, --eval-every 200, --warmup 250, --eval-examples 2000, the config's
learning rate 0.01 unless --lr) and one vocabulary; t5_cpu becomes dense_lm_cpu and switch_cpu_8
switch_lm_cpu_8. The runs: dense, top1 (the teacher), student, student_init, dense_long
(distillation's fair baseline: dense continued on its own schedule to 2 x --steps, as many steps
as teacher + student), then dense_cont and upcycled (upcycled_raw, top2 and bias on request with
--runs; ec does not apply: experts-choose routing reads later tokens). --reuse DIR takes dense
and top1 from lm_claims' finished runs DIR/dense and DIR/switch_8 of the same recipe (out/<run>
links there; neither trained nor evaluated here; the JSON's "reused" names them), the
vocabulary with them; --reuse dense=WORKDIR top1=WORKDIR names them one by one (e.g. the LR
sweep's runs at 0.04, with --lr 0.04 --vocab that sweep's tokenizer); dense_half is then
DIR/dense's checkpoint at --steps/2 where it kept one, else a dense run trained here to
--steps/2 (in the seconds of the first continued run). Writes
routing_family_lm.json and figures/routing_family_lm.png (in --out; docs/ with --publish). The
upcycled LM is written as a switchzoo checkpoint (the Hugging Face format holds no decoder-only
model), which init_from reads as it reads a run.

Another seed: every run of the study at --seed N, in its own --out and --json, reading the
first study's vocabulary (--vocab); --seeds-from the other seeds' results makes each verdict
like for like over every seed (e.g. the upcycling pair on seed 1, ~45 min on one core):

    python experiments/routing_family.py --regime lm --corpus runs/corpus --out runs/rf_lm_s1 \
        --seed 1 --vocab runs/lm/dense/tokenizer.model --runs dense_cont upcycled \
        --json runs/rf_lm_s1/routing_family_lm_s1.json --seeds-from docs/routing_family_lm.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import shutil
import subprocess
import sys
from typing import Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import harness  # noqa: E402
import lm_claims  # noqa: E402
import reuse  # noqa: E402
import switch_vs_dense as svd  # noqa: E402
import verdicts  # noqa: E402
from harness import Run  # noqa: E402

HALF = "dense_half"            # a copy of the dense workdir at --steps/2
CONTINUED = ("half:dense", "upcycle:dense")     # starts that train --steps/2 from dense's half


def keep_half(study: harness.Study, run: Run, out: pathlib.Path) -> list[str]:
    """Trains the dense run to half its steps first and keeps a copy of it (dense_half), which
    the continued runs start from; harness.run then trains it on to its steps."""
    if not (out / HALF).is_dir():
        harness.train(study, dataclasses.replace(run, steps=study.steps // 2), out)
        shutil.copytree(out / run.name, out / HALF)
    return []


def reused_half(study: harness.Study, half: Run, out: pathlib.Path) -> None:
    """dense_half where keep_half never ran (out/dense links a reused run): a copy of that run
    with its checkpoint at --steps/2 alone where it kept one, else the dense run trained here to
    --steps/2 (the same seed and data order: the reused run's first half)."""
    dense = (out / "dense").resolve()
    kept = dense / "checkpoints" / str(half.steps)
    if kept.is_dir():
        shutil.copytree(dense, out / HALF, ignore=lambda d, names: [
            n for n in names if pathlib.Path(d) == kept.parent and n != kept.name])
    else:
        harness.train(study, half, out)


def start(study: harness.Study, run: Run, out: pathlib.Path) -> list[str]:
    """Flags of how a run starts (run.starts_from) from another run's weights, with a fresh
    optimizer: "half:dense" (the dense run's checkpoint at --steps/2), "upcycle:dense" (that
    checkpoint upcycled to run.model) or "teacher:top1" (distilled from top1)."""
    kind, source = run.starts_from.split(":")
    if kind == "teacher":
        return [f"--config.distill.teacher={out / source}"]
    half = dataclasses.replace(study.get("dense"), name=HALF, steps=study.steps // 2)
    if not harness.finished(study, half, out):
        reused_half(study, half, out)
    if kind == "half":
        return [f"--config.init_from={out / HALF}"]
    upcycled = out / "upcycled_init"
    if not upcycled.is_dir():
        cmd = [sys.executable, "-m", "switchzoo.upcycle", "--dense", str(out / HALF),
               "--model", run.model, "--out", str(upcycled),
               # the published runs: straight-through on the whole continued run (issue 24's
               # recipe; the upcycle command's default is now off)
               "--straight-through-steps", "-1"]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT)
    return [f"--config.init_from={upcycled}"]


EC = ("--config.moe.router=experts_choose",)
RUNS = [   # in the order they run; the continued runs train --steps/2 (study())
    Run("dense", "t5_cpu", before=keep_half),
    Run("top1", "switch_cpu_8", baseline="dense"),
    Run("top2", "switch_cpu_8", ("--config.moe.top_k=2",), baseline="top1"),
    Run("ec", "switch_cpu_8", EC, baseline="top1"),
    Run("bias", "switch_cpu_8", ("--config.moe.balance=bias",), baseline="top1"),
    Run("dense_cont", "t5_cpu", before=start, starts_from="half:dense"),
    Run("upcycled", "switch_cpu_8", baseline="dense_cont", before=start,
        starts_from="upcycle:dense"),
    Run("upcycled_raw", "switch_cpu_8", ("--config.moe.gates_sum_to_one=false",),
        baseline="dense_cont", before=start, starts_from="upcycle:dense"),
    Run("student", "t5_cpu", ("--config.distill.weight=0.25",), baseline="dense", before=start,
        starts_from="teacher:top1"),
    Run("ec_cf2", "switch_cpu_8", EC + ("--config.moe.train_capacity_factor=2.0",),
        baseline="top1"),
    Run("student_init", "t5_cpu", ("--config.distill.weight=0.0",), baseline="dense",
        before=start, starts_from="teacher:top1"),
]


LM_MODELS = {"t5_cpu": "dense_lm_cpu", "switch_cpu_8": "switch_lm_cpu_8"}
LM = ["dense", "top1", "student", "student_init", "dense_long",               # (d)
      "dense_cont", "upcycled",                                                # (c)
      "upcycled_raw", "top2", "bias"]                                          # on request
# distillation's fair baseline: dense trained as many steps as teacher + student (the dense run
# continued on its own schedule to twice the study's steps; study() sets its steps)
DENSE_LONG = Run("dense_long", "t5_cpu", before=lm_claims.continues("dense"),
                 starts_from="continues:dense")
LM_RUNS = [dataclasses.replace(r, model=LM_MODELS[r.model]) for n in LM
           for r in [*RUNS, DENSE_LONG] if r.name == n]
REGIMES = {"span": dict(runs=RUNS, main=[r.name for r in RUNS], name="routing_family",
                        steps=1000, eval_every=125, eval_examples=500),
           "lm": dict(runs=LM_RUNS, main=LM[:7], name="routing_family_lm",       # lm_claims'
                      steps=2400, eval_every=200, eval_examples=2000)}


def study(args, docs: pathlib.Path | None) -> harness.Study:
    """The study; the continued runs train --steps/2 with a fresh schedule (--continue-warmup)."""
    runs = [dataclasses.replace(r, steps=args.steps // 2, flags=(
                *r.flags, f"--config.warmup_steps={args.continue_warmup}"))
            if r.starts_from in CONTINUED else r for r in REGIMES[args.regime]["runs"]]
    runs = [dataclasses.replace(r, seed=args.seed, steps=2 * args.steps)
            if r.name == DENSE_LONG.name else dataclasses.replace(r, seed=args.seed)
            for r in runs]                                                # every run, one seed
    if args.regime == "lm":
        base = lm_claims.study(args)
        return dataclasses.replace(
            base, runs=runs, flags=(*base.flags, *(
                [f"--config.learning_rate={args.lr:g}"] if args.lr is not None else [])),
            vocab=args.vocab.resolve() if args.vocab else None,
            title="The routing family and model surgery, decoder-only LM on English prose")
    return svd.span_study(args, args.name, runs, docs,
                          title="The routing family and model surgery, span corruption")


def findings(result: dict, others: Sequence[dict] = ()) -> dict:
    """What the runs say, from the result: dense's loss at half its steps; each router and
    balancing against top1 (loss difference, and its verdict under the one noise rule:
    verdicts.compare, over this result's seed and those of ``others``, the same study's
    results on other seeds; with one seed it has no estimate); top-2's and top-1's dropped
    fraction of their picks in training (the same slots); upcycled minus dense_cont at every
    evaluation and when it reaches dense_cont's final loss; distillation's gains and the share
    of the teacher's it keeps."""
    runs, f = result["runs"], {}
    seeded = verdicts.with_seeds(result, list(others))
    ref = verdicts.reference(seeded)
    if "dense" in runs:
        dense = runs["dense"]
        f["dense_loss_at_half"] = next((l for s, l in zip(dense["steps"], dense["eval_loss"])
                                        if s == result["steps"] // 2), None)
    for name in ("top2", "ec", "ec_cf2", "bias"):
        if name in runs and "top1" in runs:
            f[f"{name}_minus_top1"] = runs[name]["eval_loss_minus_baseline"]
            f[f"{name}_vs_top1"] = verdicts.compare(seeded, name, "top1", ref)["verdict"]
    if "top2" in runs:
        f["dropped_fraction_train"] = {n: verdicts.dropped(runs[n]) for n in ("top1", "top2")
                                       if n in runs}
    for name in ("upcycled", "upcycled_raw"):
        if name in runs and "dense_cont" in runs:
            up, cont = runs[name], runs["dense_cont"]
            f[f"{name}_minus_dense_cont"] = [round(a - b, 4) for a, b in
                                             zip(up["eval_loss"], cont["eval_loss"])]
            f[f"{name}_steps_to_dense_cont_final"] = up["steps_to_baseline_final_loss"]
            f[f"{name}_vs_dense_cont"] = verdicts.compare(seeded, name, "dense_cont",
                                                          ref)["verdict"]
            if others:
                f[f"{name}_vs_dense_cont_seeds"] = verdicts.compare(seeded, name,
                                                                    "dense_cont", ref)
    if all(n in runs for n in ("dense", "top1", "student")):
        gain = -runs["top1"]["eval_loss_minus_baseline"]
        f["teacher_gain"] = round(gain, 4)
        for name in ("student", "student_init"):
            if name in runs:
                kept = -runs[name]["eval_loss_minus_baseline"]
                f[f"{name}_gain"] = round(kept, 4)
                f[f"{name}_share_of_teacher_gain"] = (round(kept / gain, 3) if gain > 0
                                                      else None)
        if "dense_long" in runs:       # the fair share: against dense as long as teacher + student
            long = runs["dense_long"]["final_eval_loss"]
            f["dense_long_minus_dense"] = round(long - runs["dense"]["final_eval_loss"], 4)
            for name in ("student", "student_init"):
                if name in runs:
                    kept = long - runs[name]["final_eval_loss"]
                    f[f"{name}_minus_dense_long"] = round(-kept, 4)
                    f[f"{name}_share_vs_dense_long"] = (round(kept / gain, 3) if gain > 0
                                                        else None)
                    f[f"{name}_vs_dense_long"] = verdicts.compare(seeded, name, "dense_long",
                                                                  ref)
        if "student_init" in runs:     # the teacher's probabilities alone (same start)
            f["student_vs_student_init"] = verdicts.compare(seeded, "student", "student_init",
                                                            ref)
    return f


PANELS = {"(a) routers at capacity factor 1.25": ["top1", "top2", "ec", "ec_cf2"],
          "(b) balancing": ["top1", "bias"],
          "(c) upcycling a dense checkpoint": ["dense", "dense_cont", "upcycled",
                                               "upcycled_raw"],
          "(d) distilling top1 into dense": ["dense", "top1", "student", "student_init",
                                             "dense_long"]}


def plot(result: dict, path: pathlib.Path) -> None:
    """One panel per question the study asked (two or more of its runs ran); the continued runs
    drawn from the dense run's step they start at, the students from the teacher's last step
    (the steps their weights have trained, which dense_long's curve counts alike)."""
    panels = {title: names for title, names in PANELS.items()       # questions the study ran
              if sum(n in result["runs"] for n in names) > 1}
    offsets = {n: result["steps"] // 2 if r["starts_from"] in CONTINUED else result["steps"]
               for n, r in result["runs"].items()
               if r["starts_from"] in CONTINUED or str(r["starts_from"]).startswith("teacher:")}
    harness.plot_curves(result, path, panels,
                        ylabel="held-out loss (nats per target token, lower is better)",
                        offsets=offsets, xlabel="training step (continuations from the dense "
                        "run's step, students from the teacher's last)")


def markdown(result: dict) -> str:
    c = harness.COLUMNS
    return harness.markdown(result, [
        c["run"], ("model", lambda n, r: " ".join([r["model"], *r["flags"]])),
        ("starts from", lambda n, r: r["starts_from"]),
        ("steps", lambda n, r: r["train_steps"]), c["neg_log_perp"], c["accuracy"],
        c["train_ce"], ("max/mean load (train)", lambda n, r: r.get(
            "max_over_mean_expert_load_train")),
        ("dropped (train)", lambda n, r: r.get("dropped_fraction_train"))])


def arguments(argv) -> argparse.Namespace:
    """The regime's flags and defaults (--regime span: the flags as they were before --regime)."""
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--regime", choices=REGIMES, default="span",
                       help="span: span corruption (t5_cpu); lm: lm_claims.py's decoder-only LM")
    name = first.parse_known_args(argv)[0].regime
    regime = REGIMES[name]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[first])
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--runs", nargs="+", default=regime["main"],
                   choices=[r.name for r in regime["runs"]])
    p.add_argument("--steps", type=int, default=regime["steps"])
    p.add_argument("--eval-every", type=int, default=regime["eval_every"])
    if name == "span":
        svd.recipe_arguments(p)
    else:
        p.add_argument("--corpus", type=pathlib.Path, required=True,
                       help="python -m switchzoo.data.english --out CORPUS")
        p.add_argument("--reuse", nargs="+", metavar="DIR|RUN=WORKDIR",
                       help="lm_claims.py's --out (its finished dense and switch_8 runs stand "
                       "for dense and top1) or RUN=WORKDIR pairs, e.g. dense=runs/lr_sweep/"
                       "dense_lr0.04 top1=runs/lr_sweep/switch_8_lr0.04")
        p.add_argument("--lr", type=float, help="every run's learning rate (default: the "
                       "config's, 0.01)")
        p.add_argument("--warmup", type=int, default=250)
        p.add_argument("--vocab", type=pathlib.Path, help="a tokenizer.model every run reads "
                       "(default: the first run trains one), e.g. the seed-0 study's")
        p.add_argument("--eval-examples", type=int)
    p.set_defaults(eval_examples=regime["eval_examples"])
    p.add_argument("--seed", type=int, default=0, help="every run's seed (give each seed "
                   "its own --out and --json; --seeds-from reads the others' results)")
    p.add_argument("--seeds-from", type=pathlib.Path, nargs="+",
                   help="the same study's results on other seeds (their JSON), for the verdicts")
    p.add_argument("--continue-warmup", type=int, default=100,
                   help="warm-up of the runs continued from the dense checkpoint")
    p.add_argument("--report", action="store_true", help="only collect what has run")
    harness.publish_argument(p)
    p.add_argument("--json", type=pathlib.Path, help="the results (its stem names the study; "
                   f"default: {regime['name']}.json in --out, or in docs/ with --publish)")
    p.add_argument("--figure", type=pathlib.Path, help=f"default: figures/{regime['name']}.png "
                   "beside the JSON's default")
    args = p.parse_args(argv)
    args.name = args.json.stem if args.json else regime["name"]
    return args


def main(argv=None) -> int:
    args = arguments(argv)
    lm = args.regime == "lm"
    line = harness.command_line("routing_family.py", args,
                                skip=("report", "publish", "name") if lm
                                else ("report", "publish", "name", "regime"))
    args.out = args.out.resolve()
    if lm and harness.missing_corpus(args.corpus):
        return 2
    docs, corpus = (None, None) if lm else svd.english_docs(args.out, write=not args.report)
    s = study(args, docs)
    others = verdicts.seeds_from(args.seeds_from, args.seed, s)                # checked before anything trains
    if not args.report:
        if lm and args.reuse:
            reuse.link(s, args)
        harness.run(s, args.out, only=args.runs)
    reused = {r.name: (args.out / r.name).resolve() for r in s.runs
              if (args.out / r.name).is_symlink()}
    if not args.report:
        harness.evaluate(dataclasses.replace(s, runs=[r for r in s.runs if r.name not in reused]),
                         args.out)
    if lm:
        corpus = lm_claims.corpus_about(args.corpus, s.vocab or args.out / "dense" /
                                        "tokenizer.model")
    result = harness.collect(s, args.out, line, corpus=corpus)
    for name, workdir in reused.items():     # read there; seconds, commit: its study's record
        record = harness._seconds(workdir.parent)
        if name in result["runs"]:
            result["runs"][name].update(seconds=record.get(workdir.name),
                                        commit=record.get("commits", {}).get(workdir.name))
        result.setdefault("reused", {})[name] = str(
            workdir.relative_to(ROOT) if workdir.is_relative_to(ROOT) else workdir)
    result["findings"] = findings(result, others)
    corpora = {r.get("seed", 0): (o.get("corpus") or {}).get("sha1")    # each seed's build
               for o in [result, *others] for r in o["runs"].values()}
    if others and len(set(corpora.values())) > 1:     # said, not refused: pairs share theirs
        result["findings"]["corpus_by_seed"] = corpora
        print(f"note: the seeds ran on different corpus builds {corpora}; each verdict's "
              "gaps are within a seed, where both runs read the same one")
    harness.write(result, args.out, plot, publish=args.publish, path=args.json,
                  figure=args.figure)
    print(markdown(result))
    print(json.dumps(result["findings"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
