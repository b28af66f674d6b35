"""The routing family and model surgery, measured: span corruption on real English text.

    python experiments/routing_family.py --out runs/rf            # ~1 h on a 2-core CPU
    python experiments/routing_family.py --out runs/rf --report   # JSON + plot from what ran

Every run trains with experiments/switch_vs_dense.py's recipe (configs/c4.py scaled to a CPU:
Adafactor + rsqrt, no dropout, inputs 128 / targets 29, 8 sequences per step, one vocabulary,
the same seed and data order) on the same English text, evaluated every --eval-every steps on the
same held-out documents. Four questions:

  (a) routers at equal capacity factor 1.25 (switch_cpu_8: every other FFN 8 experts):
      top1 (Switch), top2 (GShard; twice the expert FLOPs), ec (experts-choose in the encoder,
      tokens-choose top-1 in the decoder, as flaxformer: C = N x 1.25 / E per expert),
      ec_cf2 (experts-choose at capacity 2.0: top-2's expert FLOPs)
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
docs/routing_family.json (harness.collect's, with the findings) and
docs/figures/routing_family.png.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import harness  # noqa: E402
import switch_vs_dense as svd  # noqa: E402
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


def start(study: harness.Study, run: Run, out: pathlib.Path) -> list[str]:
    """Flags of how a run starts (run.starts_from) from another run's weights, with a fresh
    optimizer: "half:dense" (the dense run's checkpoint at --steps/2), "upcycle:dense" (that
    checkpoint upcycled to run.model) or "teacher:top1" (distilled from top1)."""
    kind, source = run.starts_from.split(":")
    if kind == "teacher":
        return [f"--config.distill.teacher={out / source}"]
    if kind == "half":
        return [f"--config.init_from={out / HALF}"]
    upcycled = out / "upcycled_init"
    if not upcycled.is_dir():
        cmd = [sys.executable, "-m", "switchzoo.upcycle", "--dense", str(out / HALF),
               "--model", run.model, "--out", str(upcycled)]
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


def study(args, docs: pathlib.Path) -> harness.Study:
    """The study; the continued runs train --steps/2 with a fresh schedule (--continue-warmup)."""
    runs = [dataclasses.replace(r, steps=args.steps // 2, flags=(
                *r.flags, f"--config.warmup_steps={args.continue_warmup}"))
            if r.starts_from in CONTINUED else r for r in RUNS]
    return svd.span_study(args, args.json.stem, runs, docs,
                          title="The routing family and model surgery, span corruption")


def findings(result: dict) -> dict:
    runs, f = result["runs"], {}
    if "dense" in runs:
        dense = runs["dense"]
        f["dense_loss_at_half"] = next((l for s, l in zip(dense["steps"], dense["eval_loss"])
                                        if s == result["steps"] // 2), None)
    for name in ("top2", "ec", "ec_cf2", "bias"):
        if name in runs and "top1" in runs:
            f[f"{name}_minus_top1"] = runs[name]["eval_loss_minus_baseline"]
    for name in ("upcycled", "upcycled_raw"):
        if name in runs and "dense_cont" in runs:
            up, cont = runs[name], runs["dense_cont"]
            f[f"{name}_minus_dense_cont"] = [round(a - b, 4) for a, b in
                                             zip(up["eval_loss"], cont["eval_loss"])]
            f[f"{name}_steps_to_dense_cont_final"] = up["steps_to_baseline_final_loss"]
    if all(n in runs for n in ("dense", "top1", "student")):
        gain = -runs["top1"]["eval_loss_minus_baseline"]
        f["teacher_gain"] = round(gain, 4)
        for name in ("student", "student_init"):
            if name in runs:
                kept = -runs[name]["eval_loss_minus_baseline"]
                f[f"{name}_gain"] = round(kept, 4)
                f[f"{name}_share_of_teacher_gain"] = (round(kept / gain, 3) if gain > 0
                                                      else None)
    return f


PANELS = {"(a) routers at capacity factor 1.25": ["top1", "top2", "ec", "ec_cf2"],
          "(b) balancing": ["top1", "bias"],
          "(c) upcycling a dense checkpoint": ["dense", "dense_cont", "upcycled",
                                               "upcycled_raw"],
          "(d) distilling top1 into dense": ["dense", "top1", "student", "student_init"]}


def plot(result: dict, path: pathlib.Path) -> None:
    """One panel per question; the continued runs drawn from the dense run's step they start at."""
    harness.plot_curves(result, path, PANELS,
                        ylabel="held-out loss (nats per target token, lower is better)",
                        offsets={n: result["steps"] // 2 for n, r in result["runs"].items()
                                 if r["starts_from"] in CONTINUED},
                        xlabel="training step (continuations: from the dense run's step)")


def markdown(result: dict) -> str:
    lines = ["| run | model | starts from | steps | eval neg. log perp. (↑) | eval accuracy | "
             "train CE, last interval | max/mean load (train) | dropped (train) |",
             "|" + "---|" * 9]
    for name, r in result["runs"].items():
        lines.append(f"| {name} | {r['model']} {' '.join(r['flags'])} | {r['starts_from'] or '—'}"
                     f" | {r['train_steps']} | {-r['final_eval_loss']:.4f} | "
                     f"{r['final_accuracy']} | {r['train_cross_entropy_last_interval']} | "
                     f"{r.get('max_over_mean_expert_load_train') or '—'} | "
                     f"{r.get('dropped_fraction_train') or '—'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--runs", nargs="+", default=[r.name for r in RUNS],
                   choices=[r.name for r in RUNS])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--eval-every", type=int, default=125)
    svd.recipe_arguments(p)
    p.set_defaults(eval_examples=500)
    p.add_argument("--continue-warmup", type=int, default=100,
                   help="warm-up of the runs continued from the dense checkpoint")
    p.add_argument("--report", action="store_true", help="only collect what has run")
    p.add_argument("--json", type=pathlib.Path, default=ROOT / "docs/routing_family.json",
                   help="the results (its stem names the study)")
    p.add_argument("--figure", type=pathlib.Path,
                   default=ROOT / "docs/figures/routing_family.png")
    args = p.parse_args(argv)
    line = harness.command_line("routing_family.py", args)
    args.out = args.out.resolve()
    docs, corpus = svd.english_docs(args.out, write=not args.report)
    s = study(args, docs)
    if not args.report:
        harness.run(s, args.out, only=args.runs)
        harness.evaluate(s, args.out)
    result = harness.collect(s, args.out, line, corpus=corpus)
    result["findings"] = findings(result)
    harness.write(result, ROOT / "docs", plot, path=args.json, figure=args.figure)
    print(markdown(result))
    print(json.dumps(result["findings"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
