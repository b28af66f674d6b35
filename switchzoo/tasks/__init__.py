"""Downstream tasks for fine-tuning, as data: a registry of T5's text-to-text tasks (GLUE,
SuperGLUE, SQuAD, XSum, CNN/DailyMail, movie reviews), mixtures of them, and your own task
from TSV / JSONL / Parquet files.

    python -m switchzoo.tasks                     # the registry: each task, source and metrics
    tasks.resolve(config.finetune)                # [Task]: one task, or a mixture's members
    tasks.examples(task, "validation", config)    # [Example] of a split

No TensorFlow and no seqio: tfds directories prepared elsewhere are read from their files
(as the WMT and C4 sources are), local files by switchzoo.tasks.tables.
"""
from __future__ import annotations

import pathlib

from switchzoo.tasks import catalogue, tables
from switchzoo.tasks import metrics as metrics_lib
from switchzoo.tasks.task import POSTPROCESSORS, Example, Task

__all__ = ["Example", "Task", "names", "get", "resolve", "examples", "default_config"]

_BY_NAME = {t.name: t for t in catalogue.TASKS}
FILES = "files"        # finetune.task of your own task from files
DEFAULT_DATA_ROOT = "~/switchzoo_data"      # a "dir:" task's files: DATA_ROOT/<name>/


def names() -> list[str]:
    return sorted(_BY_NAME) + sorted(catalogue.MIXTURES)


def default_config():
    import ml_collections
    return ml_collections.ConfigDict(dict(
        task="",               # a registered task or mixture (python -m switchzoo.tasks; your
                               # own mixture: tasks joined by "+"), or
                               # "files": your own (train_files, eval_files, inputs, targets)
        data_dir="",           # a "dir:" task's files ("": ~/switchzoo_data/<task>); tfds
                               # tasks read data.tfds_data_dir
        train_files="",        # files task: .tsv (header), .jsonl or .parquet, comma-separated
        eval_files="",         # files task: the held-out examples (same formats)
        inputs="",             # files task: the input template, columns in braces: "review: {text}"
        targets="",            # files task: the target template: "{label}"
        labels="",             # files task: the label set, comma-separated (an integer column
                               # value i means the i-th); "": free text
        metrics="",            # files task: metrics by name (accuracy, f1, macro_f1, matthews,
                               # pearson, spearman, squad, rouge, bleu)
        eval_split="validation",   # scored every eval_every_steps; eval.py may score test
        mixture_cap=0,         # mixtures: T5's examples-proportional cap per task (0: none)
        best_metric="",        # the score the best checkpoint is kept by ("": the task's mean)
        target_length=0,       # targets rows of the packed batches (0: max_length)
        expert_dropout=0.4,    # the Switch fine-tuning recipe's dropout inside the experts, for
                               # a model with Switch layers where moe.expert_dropout is unset
    ))


def get(name: str) -> Task:
    if name not in _BY_NAME:
        raise ValueError(f"unknown task '{name}'; known: {', '.join(names())}, or "
                         f"'{FILES}' for your own (python -m switchzoo.tasks lists them)")
    return _BY_NAME[name]


def resolve(cfg) -> list[Task]:
    """The tasks ``cfg`` (a config's finetune block) names: one, a mixture's members, or the
    task of your own files."""
    if not cfg.task:
        raise ValueError("--config.finetune.task is empty; name a task (python -m "
                         f"switchzoo.tasks lists them) or '{FILES}' for your own files")
    if cfg.task == FILES:
        return [files_task(cfg)]
    if cfg.task in catalogue.MIXTURES:
        return [get(n) for n in catalogue.MIXTURES[cfg.task]]
    return [get(n.strip()) for n in cfg.task.split("+")]      # "glue_sst2+glue_cola": a mixture


class Columns(dict):
    """A row seen by a template: a missing column is one line naming file:line; an integer in
    a labelled task's column is the label of that index."""

    def __init__(self, row: dict, labels: tuple[str, ...] | None):
        super().__init__(row)
        self.labels = labels

    def __missing__(self, key):
        return tables.column(self, key)

    def __getitem__(self, key):
        value = super().__getitem__(key) if key in self else self.__missing__(key)
        if self.labels and isinstance(value, int) and not isinstance(value, bool):
            if not 0 <= value < len(self.labels):
                raise ValueError(f"{self.get('_where')}: column '{key}' is {value}, not an "
                                 f"index of the labels ({', '.join(self.labels)})")
            return self.labels[value]
        return value


def check_best_metric(members: list[Task], metric: str) -> None:
    """finetune.best_metric names a score every member reports ("": the task's own)."""
    if not metric:
        return
    for task in members:
        have = {s for m in task.metrics for s in metrics_lib.SCORES[m]}
        if metric not in have:
            raise ValueError(f"--config.finetune.best_metric={metric!r} is not a score of task "
                             f"{task.name} (it reports {', '.join(sorted(have))}); name one of "
                             "those, or leave it empty for the task's reported score")


def files_task(cfg) -> Task:
    """Your own task: templates over the files' columns, a label set or none, metrics by name."""
    missing = [k for k in ("train_files", "inputs", "targets", "metrics") if not cfg[k]]
    if missing:
        raise ValueError(f"finetune.task=files needs --config.finetune.{missing[0]} (and "
                         "train_files, inputs, targets, metrics: e.g. inputs='review: {text}' "
                         "targets='{label}' labels=negative,positive metrics=accuracy)")
    labels = tuple(x.strip() for x in cfg.labels.split(",") if x.strip()) or None
    chosen = tuple(x.strip() for x in cfg.metrics.split(",") if x.strip())
    metrics_lib.check(chosen, labels, "--config.finetune.metrics")

    def preprocess(row: dict) -> Example:
        columns = Columns(row, labels)
        target = cfg.targets.format_map(columns)
        return Example(cfg.inputs.format_map(columns), (target,),
                       float(target) if "pearson" in chosen or "spearman" in chosen else target)
    post = "label" if labels else ("float" if {"pearson", "spearman"} & set(chosen) else "text")
    return Task(FILES, FILES, preprocess, chosen, labels, post, max_target_length=32,
                about=f"your files {cfg.train_files}")


def examples(task: Task, split: str, config) -> list[Example]:
    """The examples of ``split`` (train, validation, test) of ``task``, preprocessed."""
    cfg = config.finetune
    kind, _, name = task.source.partition(":")
    if kind == FILES:
        spec = cfg.train_files if split == "train" else cfg.eval_files
        if not spec:
            raise ValueError(f"finetune.task=files has no {split} files; set "
                             "--config.finetune.eval_files=PATH[,PATH] (held-out rows)")
        rows = [r for path in spec.split(",") if path.strip() for r in tables.read(path.strip())]
    elif kind == "dir":
        rows = _dir_rows(task, name, split, cfg.data_dir)
    else:
        rows = _tfds_rows(name, task.split(split), config.data.tfds_data_dir)
    return [task.preprocess(r) for r in rows]


def _dir_rows(task: Task, name: str, split: str, data_dir: str) -> list[dict]:
    root = pathlib.Path(data_dir or f"{DEFAULT_DATA_ROOT}/{name}").expanduser()
    path = root / f"{task.split(split)}.tsv"
    if not path.is_file():
        raise ValueError(f"task {task.name}: no {path}; fetch it with python -m "
                         f"switchzoo.tasks.{name} --out {root} (or set "
                         "--config.finetune.data_dir to where it is)")
    return tables.read(path)


def _tfds_rows(name: str, split: str, data_dir: str) -> list[dict]:
    """A prepared tfds dataset's split, read from its files (no builder code)."""
    import tensorflow_datasets as tfds
    from switchzoo.data import sources
    prepared = sources.prepared_dir(name, data_dir or None)
    if prepared is None:
        where = data_dir or "the default tfds data_dir (~/tensorflow_datasets)"
        raise ValueError(f"tfds dataset '{name}' is not prepared in {where}; "
                         f"{sources.prepare_command(name)}, then set "
                         "--config.data.tfds_data_dir=DIR")
    builder = tfds.builder_from_directory(str(prepared))
    if split not in builder.info.splits:
        raise ValueError(f"{name} has no split '{split}' (it has "
                         f"{', '.join(builder.info.splits)})")
    source = builder.as_data_source(split)
    return [plain(source[i]) for i in range(len(source))]


def plain(value):
    """A tfds record as Python values: bytes -> str, arrays -> lists, nested dicts kept."""
    import numpy as np
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()] if value.ndim else plain(value.item())
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def describe() -> str:
    lines = []
    for name in sorted(_BY_NAME):
        t = _BY_NAME[name]
        lines.append(f"{name:22} {t.source:28} {', '.join(t.metrics)}"
                     + (f"  [{', '.join(t.classes)}]" if t.classes else ""))
    for name, members in sorted(catalogue.MIXTURES.items()):
        lines.append(f"{name:22} mixture of {', '.join(members)}")
    lines.append(f"{FILES:22} your own: --config.finetune.train_files, eval_files, inputs, "
                 "targets, labels, metrics")
    return "\n".join(lines)


assert all(t.postprocess in POSTPROCESSORS for t in catalogue.TASKS)
