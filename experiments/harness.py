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
stores it as docs/<name>.json and plots docs/figures/<name>.png. Studies are scripts
(experiments/*.py), never tests; tests/test_harness.py runs two tiny runs through this.
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

from common import machine  # noqa: E402
from switchzoo import atomic, zoo  # noqa: E402

ROUTING = ("router_confidence", "router_entropy", "router_logit_std")


@dataclasses.dataclass
class Run:
    name: str
    model: str
    flags: Sequence[str] = ()
    seed: int = 0
    baseline: str | None = None        # the run it is compared with (None: itself)
    steps: int | None = None           # None: the study's
    before: Callable | None = None     # (study, run, out) -> extra flags; prepares the start
    starts_from: str | None = None     # how it starts, for the record (e.g. "upcycle:dense")
    report: bool = True                # False: trained for the others (e.g. the vocabulary
                                       # alone), left out of collect and evaluate


@dataclasses.dataclass
class Study:
    name: str                          # docs/<name>.json, docs/figures/<name>.png
    config: str                        # a run config under configs/, e.g. "configs/lm_cpu.py"
    runs: Sequence[Run]
    steps: int
    eval_every: int
    flags: Sequence[str] = ()          # every run's
    title: str = ""
    checkpoint_every: int | None = None    # None: eval_every
    vocab: pathlib.Path | None = None  # a tokenizer.model every run reads (None: the first
                                       # run trains one and the others read it)
    docs: pathlib.Path = ROOT / "docs"

    def get(self, name: str) -> Run:
        return next(r for r in self.runs if r.name == name)

    def steps_of(self, run: Run) -> int:
        return run.steps or self.steps


def rows(workdir: pathlib.Path, split: str) -> list[dict]:
    """A workdir's logged rows of one split, by step (a resumed run may log a step twice: the
    last one counts)."""
    path = pathlib.Path(workdir) / "metrics.jsonl"
    if not path.is_file():
        return []
    by_step = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r["split"] == split:
            by_step[r["step"]] = r
    return [by_step[s] for s in sorted(by_step)]


def finished(study: Study, run: Run, out: pathlib.Path) -> bool:
    done = rows(out / run.name, "train")
    return bool(done) and done[-1]["step"] >= study.steps_of(run)


def command(study: Study, run: Run, out: pathlib.Path, vocab: pathlib.Path | None) -> list[str]:
    every = study.eval_every
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


def reach_step(curve: Sequence[tuple[int, float]], target: float) -> float | None:
    """The first step at which ``curve`` (step, loss) reaches ``target``, linearly interpolated
    between evaluations; None if it never does."""
    for (s0, l0), (s1, l1) in zip([(0, float("inf"))] + list(curve), curve):
        if l1 <= target:
            if l0 == float("inf"):
                return float(s1)
            return s0 + (l0 - target) / (l0 - l1) * (s1 - s0)
    return None


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
    last = [t for t in trains if t["step"] > steps - study.eval_every]
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


def collect(study: Study, out: pathlib.Path, command_line: str, **about) -> dict:
    """Every run's summary, each compared with its baseline (the step at which it first reaches
    the baseline's final eval loss, and the loss difference at the last step)."""
    seconds = _seconds(out)
    runs = {}
    for r in study.runs:
        s = summarise(study, r, out, seconds) if r.report else None
        if s is not None:
            runs[r.name] = s
    for name, s in runs.items():
        base = runs.get(s["baseline"]) if s["baseline"] else None
        if base is None or s["baseline"] == name:
            continue
        reached = reach_step(list(zip(s["steps"], s["eval_loss"])), base["final_eval_loss"])
        s["steps_to_baseline_final_loss"] = None if reached is None else round(reached)
        s["fraction_of_baseline_steps"] = (None if reached is None
                                           else round(reached / base["steps"][-1], 3))
        s["eval_loss_minus_baseline"] = round(s["final_eval_loss"] - base["final_eval_loss"], 4)
    return {"study": study.name, "command": command_line, "commit": commit(),
            "machine": machine(),
            "config": study.config, "flags": list(study.flags), "steps": study.steps,
            "eval_every": study.eval_every, **about, "runs": runs}


def command_line(script: str, args, skip: Sequence[str] = ("report",)) -> str:
    """The command that reproduces a study: experiments/<script> with every flag of ``args``
    (argparse's namespace) but ``skip``; paths in the clone relative to it."""
    def word(value) -> str:
        if isinstance(value, pathlib.Path) and value.is_relative_to(ROOT):
            return str(value.relative_to(ROOT))
        return " ".join(map(word, value)) if isinstance(value, (list, tuple)) else str(value)
    return " ".join([f"python experiments/{script}"] + [
        f"--{key.replace('_', '-')} {word(value)}" for key, value in sorted(vars(args).items())
        if key not in skip])


def markdown(result: dict, columns: Sequence[tuple[str, Callable[[str, dict], object]]]) -> str:
    """The study's runs as a Markdown table, a row per run: ``columns`` are (header,
    cell(name, summary)); a cell of None prints as a dash."""
    lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    for name, r in result["runs"].items():
        cells = (cell(name, r) for _, cell in columns)
        lines.append("| " + " | ".join("—" if c is None else str(c) for c in cells) + " |")
    return "\n".join(lines)


def _reach(r: dict) -> str | None:
    if "steps_to_baseline_final_loss" not in r:
        return None
    frac = r["fraction_of_baseline_steps"]
    return "not reached" if frac is None else f"{r['steps_to_baseline_final_loss']} ({frac:.2f})"


def signed(value, sign: float = 1.0) -> str | None:
    return None if value is None else f"{sign * value:+.4f}"


# The columns the studies share (harness.markdown's): the summaries' keys, formatted one way.
COLUMNS = {
    "run": ("run", lambda n, r: n + ("" if r.get("finished", True) else " (unfinished)")),
    "model": ("model", lambda n, r: r["model"]),
    "params": ("params", lambda n, r: f"{r['parameters'] / 1e6:.2f}M"),
    "seed": ("seed", lambda n, r: r["seed"]),
    "tokens": ("tokens", lambda n, r: f"{r['tokens_seen'] / 1e6:.1f}M"),
    "loss": ("final held-out loss", lambda n, r: f"{r['final_eval_loss']:.4f}"),
    "neg_log_perp": ("eval neg. log perp. (↑)", lambda n, r: f"{-r['final_eval_loss']:.4f}"),
    "vs_baseline": ("vs baseline", lambda n, r: signed(r.get("eval_loss_minus_baseline"))),
    "reach": ("steps to baseline's final loss", lambda n, r: _reach(r)),
    "accuracy": ("eval accuracy", lambda n, r: r["final_accuracy"]),
    "train_ce": ("train CE, last interval",
                 lambda n, r: r["train_cross_entropy_last_interval"]),
    "load": ("max/mean expert load (eval)",
             lambda n, r: r.get("max_over_mean_expert_load_eval")),
    "tokens_per_sec": ("tokens/s", lambda n, r: round(r["tokens_per_sec"])
                       if r.get("tokens_per_sec") else None),
}


def seed_spread(result: dict, names: Sequence[str]) -> dict | None:
    """Mean and spread (max - min) of the final eval loss over runs that differ by seed."""
    losses = [result["runs"][n]["final_eval_loss"] for n in names if n in result["runs"]]
    if len(losses) < 2:
        return None
    return {"runs": list(names), "mean": round(statistics.fmean(losses), 4),
            "spread": round(max(losses) - min(losses), 4)}


def mean_curve(result: dict, names: Sequence[str]) -> list[tuple[int, float]]:
    """The step-wise mean eval curve of runs that differ by seed (their common steps)."""
    curves = [dict(zip(result["runs"][n]["steps"], result["runs"][n]["eval_loss"]))
              for n in names if n in result["runs"]]
    common = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    return [(s, statistics.fmean(c[s] for c in curves)) for s in common]


def write(result: dict, docs: pathlib.Path, plot: Callable | None = None,
          path: pathlib.Path | None = None, figure: pathlib.Path | None = None,
          log=print) -> pathlib.Path | None:
    """docs/<study>.json (or ``path``) and, with ``plot(result, figure)``,
    docs/figures/<study>.png (or ``figure``). A result with no runs writes nothing (a report
    before anything ran must not replace published results)."""
    if not result["runs"]:
        log(f"no run of {result['study']} has been evaluated yet: nothing written")
        return None
    path = path or docs / f"{result['study']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    if plot is not None:
        figure = figure or docs / "figures" / f"{result['study']}.png"
        figure.parent.mkdir(parents=True, exist_ok=True)
        plot(result, figure)
    return path


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_curves(result: dict, path: pathlib.Path, groups: dict[str, Sequence[str]] | None = None,
                ylabel: str = "held-out loss (nats per token, lower is better)",
                offsets: dict[str, int] | None = None,
                xlabel: str = "training step") -> None:
    """Eval loss against step, one panel per group of runs (default: every run in one);
    ``offsets``: steps added to a run's (a continuation drawn from the step it starts at)."""
    plt = _pyplot()
    groups = groups or {result["study"]: list(result["runs"])}
    groups = {t: [n for n in names if n in result["runs"]] for t, names in groups.items()}
    groups = {t: names for t, names in groups.items() if names}
    offsets = offsets or {}
    fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 4.5), squeeze=False)
    for ax, (title, names) in zip(axes[0], groups.items()):
        for i, name in enumerate(names):
            r = result["runs"][name]
            ax.plot([s + offsets.get(name, 0) for s in r["steps"]], r["eval_loss"], marker="o",
                    ms=2.5, lw=1.2, color=f"C{i % 10}",
                    ls="--" if r["model"].startswith(("dense", "t5")) else "-",
                    label=f"{name} ({r['final_eval_loss']:.3f})")
        finals = [result["runs"][n]["final_eval_loss"] for n in names]
        ax.set_ylim(min(finals) - 0.1, min(finals) + 1.0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_router_curves(result: dict, path: pathlib.Path) -> bool:
    """Router entropy, confidence (mean top probability) and logit std against step, per run
    and Switch layer: how far routing has left uniform. False (and no file) without routed
    runs."""
    curves = {n: r["router_curves"] for n, r in result["runs"].items()
              if r.get("router_curves") and r["router_curves"]["router_entropy"][-1]}
    if not curves:
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(ROUTING), figsize=(14, 3.8))
    for ax, key in zip(axes, ROUTING):
        for i, (name, c) in enumerate(curves.items()):
            logged = [(s, v) for s, v in zip(c["step"], c[key]) if v is not None]
            for layer in range(len(logged[-1][1])):
                ax.plot([s for s, _ in logged], [v[layer] for _, v in logged],
                        color=f"C{i % 10}", lw=1, ls=("-", "--", ":", "-.")[layer % 4],
                        label=f"{name}, Switch layer {layer}")
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
