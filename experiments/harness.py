"""The one experiment harness: a study (a list of runs) -> train.py workdirs -> JSON and plots.

A ``Study`` names a run config, the flags every run shares, the steps, the evaluation interval
and its runs; each ``Run`` names a catalogue model, its own flags, a seed, the run it is compared
with and, optionally, how it starts (``before``: a function that prepares its start, e.g. an
upcycled checkpoint, and returns extra flags). ``run(study, out)`` trains what is unfinished, in
order (train.py resumes a workdir from its last checkpoint, so a study spans sittings: run it
again); the first run trains the vocabulary and every other run reads it. ``evaluate`` runs
eval.py on each finished run (its results.json: what ``eval.py --table`` and switchzoo.tables
read). ``collect`` reads every workdir's metrics.jsonl into one result: every eval curve, the
routing diagnostics of the last training interval (expert loads, dropped tokens, router entropy /
confidence / logit std and their curves), tokens seen, seconds, seed, parameters, the commit
each run last started from, the report's commit and the machine (CPU model and ISA); ``write``
stores it beside the runs (--out/<name>.json, --out/figures/<name>.png), and only with
--publish as the published docs/<name>.json and docs/figures/<name>.png. The arithmetic the
studies judge with is verdicts.py (and switchzoo.noise), the plots plots.py, the Markdown
tables report.py. Studies are scripts (experiments/*.py), never tests; tests/test_harness.py
runs two tiny runs through this.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Callable, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "experiments"))

from common import machine  # noqa: E402
from plots import ROUTING, plot_curves, plot_router_curves  # noqa: E402,F401 (the studies')
from study_report import COLUMNS, markdown, signed  # noqa: E402,F401
from switchzoo import atomic, metrics, zoo  # noqa: E402
from verdicts import against_baselines, mean_curve, reach_step, seed_spread  # noqa: E402,F401

DOCS = ROOT / "docs"                   # the published results


@dataclasses.dataclass
class Run:
    name: str
    model: str
    flags: Sequence[str] = ()
    seed: int = 0
    baseline: str | None = None        # the run it is compared with (None: itself)
    steps: int | None = None           # None: the study's
    eval_every: int | None = None      # None: the study's (a run of fewer, larger steps
                                       # evaluates as often in tokens)
    before: Callable | None = None     # (study, run, out) -> extra flags; prepares the start
    starts_from: str | None = None     # how it starts, for the record (e.g. "upcycle:dense")
    report: bool = True                # False: trained for the others (e.g. the vocabulary
                                       # alone), left out of collect and evaluate


@dataclasses.dataclass
class Study:
    name: str                          # <name>.json, figures/<name>.png (write)
    config: str                        # a run config under configs/, e.g. "configs/lm_cpu.py"
    runs: Sequence[Run]
    steps: int
    eval_every: int
    flags: Sequence[str] = ()          # every run's
    title: str = ""
    checkpoint_every: int | None = None    # None: eval_every
    vocab: pathlib.Path | None = None  # a tokenizer.model every run reads (None: the first
                                       # run trains one and the others read it)

    def get(self, name: str) -> Run:
        return next(r for r in self.runs if r.name == name)

    def steps_of(self, run: Run) -> int:
        return run.steps or self.steps

    def every_of(self, run: Run) -> int:
        return run.eval_every or self.eval_every


def seeded_name(name: str, seed: int) -> str:
    """The studies' one naming of a run's seed: seed 0 bare, else ``_sN`` (dense, dense_s1)."""
    return name + (f"_s{seed}" if seed else "")


def rows(workdir: pathlib.Path, split: str) -> list[dict]:
    """A workdir's logged rows of one split, by step (a resumed run may log a step twice: the
    last one counts)."""
    path = pathlib.Path(workdir) / "metrics.jsonl"
    if not path.is_file():
        return []
    by_step = {}
    for r in metrics.read_rows(path):       # without a last line a crash cut
        if r["split"] == split:
            by_step[r["step"]] = r
    return [by_step[s] for s in sorted(by_step)]


def finished(study: Study, run: Run, out: pathlib.Path) -> bool:
    done = rows(out / run.name, "train")
    return bool(done) and done[-1]["step"] >= study.steps_of(run)


def command(study: Study, run: Run, out: pathlib.Path, vocab: pathlib.Path | None) -> list[str]:
    every = study.every_of(run)
    cmd = [sys.executable, str(ROOT / "train.py"),
           f"--config={ROOT / study.config}:model={run.model},steps={study.steps_of(run)}",
           f"--workdir={out / run.name}", f"--config.seed={run.seed}",
           f"--config.eval_every_steps={every}",
           f"--config.checkpoint_every_steps={study.checkpoint_every or every}",
           f"--config.log_every_steps={max(1, every // 5)}", *study.flags]
    if vocab is not None:
        cmd.append(f"--config.data.vocab_path={vocab}")
    return cmd + list(run.flags)


def vocabulary(study: Study, out: pathlib.Path, run: Run) -> pathlib.Path | None:
    """The study's vocabulary, else the first run trains one and the others read its
    tokenizer.model."""
    if study.vocab is not None:
        return study.vocab
    first = study.runs[0]
    return None if run.name == first.name else out / first.name / "tokenizer.model"


def train(study: Study, run: Run, out: pathlib.Path, extra: Sequence[str] = (),
          log=print) -> None:
    """Trains (or continues: train.py resumes from the last checkpoint) out/<run> to its steps."""
    cmd = command(study, run, out, vocabulary(study, out, run)) + list(extra)
    log(" ".join(cmd))
    subprocess.run(cmd, check=True)


def _seconds(out: pathlib.Path) -> dict:
    """out/seconds.json: {run: wall seconds of its sittings, "commits": {run: commit}}."""
    path = out / "seconds.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def run(study: Study, out: pathlib.Path, only: Sequence[str] | None = None,
        log=print) -> None:
    """Trains every unfinished run of ``study`` (or of ``only``; and the first run while the
    vocabulary the others read is not there) into out/<run>, in order; its ``before`` first."""
    out.mkdir(parents=True, exist_ok=True)
    first = study.runs[0]
    for r in study.runs:
        wanted = (not only or r.name in only
                  or (r is first and study.vocab is None
                      and not (out / r.name / "tokenizer.model").is_file()))
        if not wanted or finished(study, r, out):
            continue
        code, start = commit(), time.time()                        # the code it starts with
        train(study, r, out, r.before(study, r, out) if r.before else (), log)
        # read again after the run: another invocation on other runs of this out may have
        # written the record meanwhile (a study split over processes), and keeps its entries
        seconds = _seconds(out)
        seconds.setdefault("commits", {})[r.name] = code
        seconds[r.name] = round(seconds.get(r.name, 0) + time.time() - start, 1)
        atomic.write_text(out / "seconds.json", json.dumps(seconds))


def evaluate(study: Study, out: pathlib.Path, log=print) -> None:
    """``python eval.py --workdir=out/<run>`` for every finished run whose results.json is
    missing or older than its metrics.jsonl, so that ``eval.py --table=...`` (switchzoo.tables)
    reads the runs."""
    for r in study.runs:
        workdir = out / r.name
        results = workdir / "results.json"
        if not r.report or not finished(study, r, out) or (
                results.is_file()
                and results.stat().st_mtime > (workdir / "metrics.jsonl").stat().st_mtime):
            continue
        cmd = [sys.executable, str(ROOT / "eval.py"), f"--workdir={workdir}"]
        log(" ".join(cmd))
        subprocess.run(cmd, check=True)


def _average(values: list):
    """The element-wise mean of equally nested lists (or of numbers), to 4 decimals."""
    if isinstance(values[0], list):
        return [_average([v[i] for v in values]) for i in range(len(values[0]))]
    return round(statistics.fmean(values), 4)


def _mean(rs: list[dict], key: str):
    """The mean of a logged metric over rows: a scalar, per layer, or per layer and expert
    (None where it was not logged)."""
    values = [r[key] for r in rs if r.get(key) is not None]
    return _average(values) if values else None


def _max_over_mean(loads) -> list[float] | None:
    """Per layer: the busiest expert's load over the mean load (1.0: perfectly balanced)."""
    return [round(max(x) / statistics.fmean(x), 3) for x in loads] if loads else None


def summarise(study: Study, r: Run, out: pathlib.Path, seconds: dict) -> dict | None:
    evals, trains = rows(out / r.name, "eval"), rows(out / r.name, "train")
    if not evals:
        return None
    steps = study.steps_of(r)
    last = [t for t in trains if t["step"] > steps - study.every_of(r)]
    final = evals[-1]
    per_step = statistics.fmean(t["tokens"] for t in trains) if trains else 0.0
    load = final.get("expert_load")
    summary = {
        "model": r.model, "flags": list(r.flags), "seed": r.seed, "baseline": r.baseline,
        "starts_from": r.starts_from, "parameters": zoo.count_params(r.model),
        "train_steps": steps, "finished": bool(trains) and trains[-1]["step"] >= steps,
        "tokens_seen": round(per_step * trains[-1]["step"]) if trains else 0,
        "steps": [e["step"] for e in evals],
        "eval_loss": [round(e["loss"], 4) for e in evals],
        "eval_accuracy": [e.get("accuracy") for e in evals],
        "final_eval_loss": round(final["loss"], 4),
        "final_accuracy": final.get("accuracy"),
        "train_cross_entropy_last_interval": _mean(last, "cross_entropy"),
        # the training cross-entropy over the interval before each evaluation (None: none logged)
        "train_cross_entropy": [_mean([t for t in trains if before < t["step"] <= e["step"]],
                                      "cross_entropy")
                                for before, e in zip([0] + [e["step"] for e in evals], evals)],
        "tokens_per_sec": _mean(last, "tokens_per_sec"),
        "seconds": seconds.get(r.name),
        "commit": seconds.get("commits", {}).get(r.name),
    }
    for key in ("token_perplexity", "word_perplexity", "bleu"):
        if final.get(key) is not None:
            summary[f"final_{key}"] = round(final[key], 3)
    if _mean(last, "distill_ce") is not None:
        summary["train_distill_ce_last_interval"] = _mean(last, "distill_ce")
    if load:
        summary["max_over_mean_expert_load_eval"] = _max_over_mean(load)
        summary["max_over_mean_expert_load_train"] = _max_over_mean(_mean(last, "expert_load"))
        summary["expert_load_eval"] = [[round(v, 4) for v in x] for x in load]
        summary["dropped_fraction_eval"] = final.get("dropped_fraction")
        summary["dropped_fraction_train"] = _mean(last, "dropped_fraction")
        for key in ROUTING:
            summary[f"{key}_train"] = _mean(last, key)
        summary["router_curves"] = {k: [t.get(k) for t in trains] for k in ("step",) + ROUTING}
    return summary


def commit() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


def published_runs(name: str, corpus: dict, docs: pathlib.Path = DOCS, log=print) -> dict:
    """The runs of the published docs/<name>.json, for ``collect`` to fill in what --out no
    longer holds (runs/ is scratch: a new checkout starts without it, so a study that spans
    sittings would otherwise publish only its latest runs). Only when they read the same text
    in the same tokens: ``corpus`` (lm_claims.corpus_about of this sitting's corpus and
    vocabulary) must give the published corpus's sha1 and its train and eval sizes in tokens
    (and the tokenizer's sha1, where both recorded it); else {} and one line saying why."""
    path = docs / f"{name}.json"
    if not path.is_file():
        return {}
    old = json.loads(path.read_text())
    mine, theirs = corpus or {}, old.get("corpus") or {}
    keys = [("sha1",), ("train", "tokens"), ("eval", "tokens")] + (
        [("tokenizer_sha1",)] if "tokenizer_sha1" in mine and "tokenizer_sha1" in theirs else [])

    def at(d, key):
        for k in key:
            d = d.get(k) if isinstance(d, dict) else None
        return d
    differ = [".".join(k) for k in keys if at(mine, k) is None or at(mine, k) != at(theirs, k)]
    if differ:
        log(f"note: {path.relative_to(docs.parent)}'s runs are not carried over: its corpus "
            f"differs from this one in {', '.join(differ)}")
        return {}
    return {n: {**r, "carried_from": f"{path.relative_to(docs.parent)} at {old['commit'][:7]}"}
            for n, r in old.get("runs", {}).items()}


def collect(study: Study, out: pathlib.Path, command_line: str, published: dict | None = None,
            **about) -> dict:
    """Every run's summary, each compared with its baseline (the step at which it first reaches
    the baseline's final eval loss, and the loss difference at the last step). A run --out
    does not hold is taken from ``published`` where that has it, marked with ``carried_from``
    (default: published_runs of the study's published JSON, given ``corpus`` in ``about``)."""
    if published is None and "corpus" in about:
        published = published_runs(study.name, about["corpus"])
    seconds = _seconds(out)
    runs = {}
    for r in study.runs:
        s = summarise(study, r, out, seconds) if r.report else None
        if s is None and r.report and r.name in (published or {}):
            s = dict(published[r.name])
        if s is not None:
            runs[r.name] = s
    against_baselines(runs)
    return {"study": study.name, "command": command_line, "commit": commit(),
            "machine": machine(),
            "config": study.config, "flags": list(study.flags), "steps": study.steps,
            "eval_every": study.eval_every, **about, "runs": runs}


def command_line(script: str, args, skip: Sequence[str] = ("report", "publish")) -> str:
    """The command that reproduces a study: experiments/<script> with every flag of ``args``
    (argparse's namespace) but ``skip`` and those left unset (None); paths in the clone
    relative to it."""
    def word(value) -> str:
        if isinstance(value, pathlib.Path) and value.is_relative_to(ROOT):
            return str(value.relative_to(ROOT))
        return " ".join(map(word, value)) if isinstance(value, (list, tuple)) else str(value)
    return " ".join([f"python experiments/{script}"] + [
        f"--{key.replace('_', '-')} {word(value)}" for key, value in sorted(vars(args).items())
        if key not in skip and value is not None])


def publish_argument(p) -> None:
    """--publish: the flag every study script takes (argparse parser ``p``)."""
    p.add_argument("--publish", action="store_true",
                   help="write the published result, docs/NAME.json and docs/figures/NAME.png "
                        "(default: the run directory, --out/NAME.json and --out/figures/)")


def unpublished(path: pathlib.Path, publish: bool, docs: pathlib.Path = DOCS) -> pathlib.Path:
    """``path``, unless it is under docs/ (a published result) and ``publish`` is off: then
    SystemExit with one line."""
    if not publish and pathlib.Path(path).resolve().is_relative_to(pathlib.Path(docs).resolve()):
        raise SystemExit(f"error: {path} is a published result; pass --publish to replace it, "
                         "or leave it out to write beside the runs")
    return path


def write(result: dict, out: pathlib.Path, plot: Callable | None = None, publish: bool = False,
          path: pathlib.Path | None = None, figure: pathlib.Path | None = None,
          docs: pathlib.Path = DOCS, log=print) -> pathlib.Path | None:
    """The study's JSON and, with ``plot(result, figure)``, its figure: beside its runs
    (out/<study>.json, out/figures/<study>.png), or with ``publish`` the published result
    (docs/<study>.json, docs/figures/<study>.png); ``path`` / ``figure`` name other files. A
    file under docs/ is written only with ``publish``: a short or partial run must not replace
    a study's published result unless asked (SystemExit with one line otherwise). A result
    with no runs writes nothing."""
    if not result["runs"]:
        log(f"no run of {result['study']} has been evaluated yet: nothing written")
        return None
    where = docs if publish else out
    path = path or where / f"{result['study']}.json"
    figure = None if plot is None else figure or where / "figures" / f"{result['study']}.png"
    for f in (path, figure):
        if f is not None:
            unpublished(f, publish, docs)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    if figure is not None:
        figure.parent.mkdir(parents=True, exist_ok=True)
        plot(result, figure)
    log(f"wrote {path}" + ("" if publish else
                           f" (docs/{result['study']}.json is left as it is; --publish "
                           "replaces it)"))
    if publish and path.parent.resolve() == docs.resolve():
        import orderings                  # the table of every published verdict, kept fresh
        log(f"wrote {orderings.write(docs)}")
    return path


def held_out_config(workdir: pathlib.Path, corpus: pathlib.Path, overrides: dict | None = None):
    """A trained run's config (evaluate.load_config) reading <corpus>/eval.txt as its held-out
    text, with ``overrides`` ({dotted field: text}); its vocabulary path, recorded relative to
    the repository root, resolved. FileNotFoundError (one line) without eval.txt."""
    from switchzoo import evaluate
    eval_file = pathlib.Path(corpus) / "eval.txt"
    if not eval_file.is_file():
        raise FileNotFoundError(f"no {eval_file}; pass --corpus DIR holding the held-out "
                                "eval.txt (python -m switchzoo.data.english --out runs/corpus "
                                "builds it)")
    config = evaluate.load_config(workdir, {"data.eval_files": str(eval_file),
                                            **(overrides or {})})
    vocab = pathlib.Path(config.data.vocab_path)
    if config.data.vocab_path and not vocab.is_absolute() and not vocab.is_file():
        config.data.vocab_path = str(ROOT / vocab)
    return config


def restore_held_out(config, workdir: pathlib.Path, task: str | None = None):
    """(data, set-up, parameters, step): ``config``'s held-out batches at the run's global
    batch (data.build, evaluating) and its newest checkpoint's parameters
    (evaluate.restore_params), on the run's layout."""
    from switchzoo import data, evaluate
    from switchzoo import state as state_lib
    ds = data.build(config.data, workdir, task=task or config.task,
                    batch_size=state_lib.global_batch_size(config),
                    max_length=config.max_length, seed=config.seed, evaluating=True)
    setup, params, step = evaluate.restore_params(config, workdir, state_lib.run_layout(config),
                                                  ds.tokenizer.vocab_size, ds.tokenizer.num_pieces)
    return ds, setup, params, step


def missing_corpus(corpus: pathlib.Path | None) -> bool:
    """True (after one line on stderr) where ``corpus`` holds no train.txt."""
    if corpus is not None and (pathlib.Path(corpus) / "train.txt").is_file():
        return False
    print(f"error: no {corpus}/train.txt; build it with python -m switchzoo.data.english "
          f"--out {corpus or 'CORPUS'} and pass --corpus", file=sys.stderr)
    return True
