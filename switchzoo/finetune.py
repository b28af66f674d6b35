"""Fine-tuning on a downstream task (task=text2text, switchzoo.tasks): score a model on a task's
split with the task's metric, and keep the best checkpoint by that score.

Scoring decodes: greedy outputs of at most the task's ``max_target_length`` tokens, detokenized
and post-processed by the task (a label outside the label set is scored wrong and counted as
``invalid_outputs``), as T5 scores its tasks. Each example's output does not depend on the
others in its batch: evaluation routes each sequence as its own group (moe.eval_groups).

The best checkpoint (the paper reports each fine-tune's peak) lives in ``workdir/best/``: its
own Orbax checkpoint of the weights, ``model.json`` (so ``best/`` loads as a run does:
``init_from``, ``eval.py --checkpoint``, ``switchzoo.from_pretrained``) and ``best.json`` (step,
the score it was chosen by, every score).
"""
from __future__ import annotations

import json
import pathlib

from typing import Callable

from switchzoo import atomic, checkpoints, hosts, weights
from switchzoo.tasks import metrics as metrics_lib
from switchzoo.weights import BEST_DIR

BEST_FILE = "best.json"


def score(model, ds, config, share: hosts.Share, decode: Callable) -> dict:
    """{task name: its scores, with "_outputs" (the outputs, in order) and "_task"} on the
    run's eval split (ds.task_examples): ``decode`` is evaluate.translate, called greedy with
    each task's decoding budget."""
    results = {}
    for task, examples in ds.task_examples.items():
        outs = decode(model, ds, [e.inputs for e in examples], config, share,
                      max_new=task.max_target_length, beams=1)
        results[task.name] = {**task.score(outs, examples), "_outputs": outs, "_task": task}
    return results


def paper_score(results: dict) -> float:
    """The run's number in a paper's table: its task's reported score (movie_reviews and GLUE's
    accuracy, SQuAD's exact match, XSum's ROUGE-2, a GLUE task with two metrics their mean), or
    a benchmark's average over its members (GLUE, SuperGLUE: metrics.benchmark_average)."""
    if len(results) == 1:
        (r,) = results.values()
        return round(r["_task"].paper_score(_scores(r)), 6)
    return round(metrics_lib.benchmark_average({n: _scores(r) for n, r in results.items()}), 6)


def _scores(r: dict) -> dict:
    return {k: v for k, v in r.items() if not k.startswith("_")
            and k not in ("invalid_outputs", "examples")}


def headline(results: dict, metric: str = "") -> float:
    """The number the best checkpoint is kept by: ``metric`` of the one task (or its mean over
    a mixture's members), else the run's paper_score."""
    if not metric:                  # (a metric is a score of every task: checked at the start,
        return paper_score(results)     # tasks.check_best_metric)
    return sum(r[metric] for r in results.values()) / len(results)


def public(results: dict) -> dict:
    """The results without the outputs (for metrics.jsonl and results.json)."""
    return {task: {k: v for k, v in r.items() if not k.startswith("_")}
            for task, r in results.items()}


def best_record(workdir: pathlib.Path) -> dict | None:
    path = pathlib.Path(workdir) / BEST_DIR / BEST_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        raise ValueError(f"{path} is not valid JSON; remove {path.parent} (the best checkpoint "
                         "is chosen again from the next evaluation)") from None


class Best:
    """The best checkpoint so far; ``offer`` saves the parameters when they beat it. Every
    process calls it (Orbax saves collectively); process 0 writes best.json."""

    def __init__(self, workdir: pathlib.Path, cfg, lead: bool, metric: str = ""):
        self.directory = pathlib.Path(workdir) / BEST_DIR
        self.cfg, self.lead, self.metric = cfg, lead, metric
        record = best_record(workdir)
        self.value = None if record is None else record["value"]

    def offer(self, step: int, params, results: dict) -> bool:
        value = headline(results, self.metric)
        if self.value is not None and value <= self.value:
            return False
        ckpt = checkpoints.Checkpoints(self.directory / "checkpoints", 1, 1, use_async=False,
                                       writer=self.lead)
        try:
            ckpt.save_params(step, params)
        finally:
            ckpt.close()
        if self.lead:
            weights.write_model(self.directory, self.cfg)
            atomic.write_text(self.directory / BEST_FILE, json.dumps(
                {"step": step, "metric": self.metric or "task_score", "value": value,
                 "scores": public(results)}, indent=1) + "\n")
        self.value = value
        return True
