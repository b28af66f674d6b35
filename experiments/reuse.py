"""The LM regime's reused runs (experiments/routing_family.py --reuse): finished workdirs of the
same recipe that stand for the study's dense and top1 (lm_claims' runs, or any named one, e.g.
the LR sweep's), linked into --out after their recipe is checked."""
from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

import harness

ROOT = pathlib.Path(__file__).resolve().parents[1]
REUSED = {"dense": "dense", "top1": "switch_8"}     # run -> lm_claims' run of the same recipe


def sources(args) -> dict[str, pathlib.Path]:
    """run -> the finished workdir that stands for it: --reuse DIR (lm_claims' --out: its dense
    and switch_8, with _sSEED on another seed) and/or RUN=WORKDIR pairs (e.g. the LR sweep's)."""
    sources = {}
    for item in args.reuse or []:
        name, eq, path = item.partition("=")
        if not eq:
            suffix = f"_s{args.seed}" if args.seed else ""       # lm_claims' names its seeds so
            sources.update({run: pathlib.Path(item) / (source + suffix)
                            for run, source in REUSED.items()})
        elif name not in REUSED:
            sys.exit(f"error: --reuse {item}: only {' and '.join(REUSED)} can be reused "
                     "(RUN=WORKDIR)")
        else:
            sources[name] = pathlib.Path(path)
    return sources


def config_value(study: harness.Study, key: str):
    """The study's config file's value of ``key`` (no flag given)."""
    from switchzoo.planner.command import load_config       # the run-config file reader
    return load_config(str(ROOT / study.config))[key]


def link(study: harness.Study, args) -> None:
    """out/<run> -> its reused workdir (sources) for each not here yet; it must be
    finished under the study's recipe, its curve standing for the run's."""
    corpus = args.corpus.resolve()
    for name, there in sources(args).items():
        run, link, there = study.get(name), args.out / name, there.resolve()
        if link.exists() or link.is_symlink():
            continue
        c = json.loads((there / "config.json").read_text()) if (
            there / "config.json").is_file() else {}
        got = [c.get(k) for k in ("model", "seed", "num_train_steps", "eval_every_steps",
                                  "warmup_steps", "learning_rate")] + [
            c.get("data", {}).get(k) for k in ("train_files", "eval_files", "max_eval_examples")]
        lr = args.lr if args.lr is not None else config_value(study, "learning_rate")
        want = [run.model, run.seed, study.steps, study.eval_every, args.warmup, lr,
                str(corpus / "train.txt"), str(corpus / "eval.txt"), args.eval_examples]
        if got != want or not harness.finished(
                study, dataclasses.replace(run, name=there.name), there.parent):
            sys.exit(f"--reuse: {there} is not a finished run of {want} (model, seed, steps, "
                     f"eval every, warm-up, learning rate, train, eval files, eval examples): "
                     f"it has {got}")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(there, target_is_directory=True)
