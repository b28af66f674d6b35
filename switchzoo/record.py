"""A run's record in its workdir, read with one-line errors and kept true.

config.json (the resolved run config) is read here for train.py's resume and eval.py: a file
that is not JSON, a value of the wrong type or a missing field is refused in one line naming the
file and what to do. A resumed run compares its config with the saved one (``changed``): a
setting that changes what is trained (rates, schedule, model, data, batch, seed ...: every field
not in NEUTRAL) is refused unless ``--config.allow_changes=True``, and then recorded in
config.json's ``changes`` list at the step it took effect, so config.json keeps what held when.
Evaluation on another evaluation set than the run's own writes its own results file
(``results_names``): the run's held-out results.json is never replaced by it.
"""
from __future__ import annotations

import hashlib
import json
import pathlib
import re

import ml_collections

from switchzoo.configs import base
from switchzoo.state import global_batch_size

CONFIG_FILE = "config.json"
CHANGES = "changes"        # config.json: [{"step", "field", "old", "new"}], oldest first
# config.json: the batch the run trained with, per_device_batch_size x the devices it ran on (a
# resume on another number of devices changes it without changing any field; the same global
# batch on other devices reads the same rows, so per_device_batch_size alone is then neutral).
GLOBAL_BATCH = "global_batch_size"
FIX = "restore it from a copy of the run, or start a new --workdir"
# Fields a run cannot do without: today's defaults would silently stand in for them.
REQUIRED = ("model", "task", "max_length", "data.source")
# Fields a resumed run may change without changing what is trained: how long and how often it
# logs, evaluates and checkpoints, where it runs and reads from, how a step is executed (the
# same function: layout, remat, scan, attention kernel, loss chunks, grouped-matmul blocks), the
# evaluation-only settings, and the run's own controls. Every other field is a training setting.
NEUTRAL = frozenset((
    "num_train_steps", "log_every_steps", "eval_every_steps", "checkpoint_every_steps",
    "keep_checkpoints", "layout", "mesh", "shard_optimizer_over_data", "scan_layers", "remat",
    "pipeline_microbatches", "pipeline_repeats",
    "attention", "loss_chunk", "moe.grouped_matmul", "moe.block_size",
    "moe.eval_capacity_factor", "data.prefetch", "data.tfds_data_dir", "data.max_eval_examples",
    "data.eval_split", "allow_changes", "restore_step",
    # the embedded corpus and manuals are cached in the workdir when the run starts
    "data.locale_dir", "data.info_dir",
    "eval.num_beams", "eval.length_penalty", "eval.max_decode_length", "eval.max_examples"))


def _same_bytes(old, new) -> bool:
    """Two names of one file's content (e.g. a relative and an absolute path to a tokenizer)."""
    try:
        return bool(old) and bool(new) and (pathlib.Path(old).read_bytes() ==
                                            pathlib.Path(new).read_bytes())
    except OSError:
        return False


# Fields neutral only between some values: the capacity dispatches (index, einsum, auto) route
# alike, dropless drops nothing; without eval_files, data.source=files holds evaluation
# examples out of the training files; a vocabulary named by another path with the same bytes.
NEUTRAL_BETWEEN = {
    "moe.dispatch": lambda old, new: "dropless" not in (old, new),
    "data.eval_files": lambda old, new: bool(old) and bool(new),
    "data.vocab_path": _same_bytes,
}
# What selects the evaluation examples (results_names); the rest is how they are evaluated.
EVAL_SET = ("data.eval_files", "data.eval_split", "data.max_eval_examples",
            "finetune.eval_split", "finetune.eval_files",
            # how many examples are decoded (0: perplexity only): an evaluation that decodes
            # fewer measures less, and must not replace the run's own results
            "eval.max_examples")


def read_json(path: pathlib.Path, fix: str = FIX) -> dict:
    """The JSON object in ``path``; ValueError in one line naming the file and ``fix``."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text: {fix}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON (line {e.lineno}): {fix}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a JSON {type(value).__name__}, not an object of config "
                         f"fields: {fix}")
    return value


def flatten(d: dict, prefix: str = "") -> dict:
    """{dotted field: value} of a nested dict."""
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


KINDS = {int: "an int", float: "a number", str: "a string", bool: "true or false"}


def _fits(value, kind: type, optional: bool) -> bool:
    if value is None:
        return optional
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def read_config(workdir: pathlib.Path) -> dict:
    """A run's config.json as a nested dict (without its ``changes``), every field of today's
    config present there of the type the field has, and the REQUIRED ones present."""
    path = pathlib.Path(workdir) / CONFIG_FILE
    saved = read_json(path)
    saved.pop(CHANGES, None)
    saved.pop(GLOBAL_BATCH, None)
    defaults = base.get_base()
    for field, value in flatten(saved).items():
        *parents, leaf = field.split(".")
        node = defaults
        for i, part in enumerate(parents):
            if not isinstance(node, ml_collections.ConfigDict) or part not in node:
                node = None
                break
            if not isinstance(node[part], ml_collections.ConfigDict):
                raise ValueError(f"{path}: {'.'.join(parents[:i + 1])} is a JSON object, not "
                                 f"a value: {FIX}")
            node = node[part]
        if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
            continue        # a field this version does not have (an older run's)
        if isinstance(node[leaf], ml_collections.ConfigDict):
            raise ValueError(f"{path}: {field} is {json.dumps(value)}, not a section of "
                             f"fields: {FIX}")
        kind = node.get_type(leaf)
        if not _fits(value, kind, optional=node[leaf] is None):
            raise ValueError(f"{path}: {field} is {json.dumps(value)}, not "
                             f"{KINDS.get(kind, kind.__name__)}: {FIX}")
    for field in REQUIRED:
        node = saved
        for part in field.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            raise ValueError(f"{path} lacks the field {field}: {FIX}")
    return saved


def read_changes(workdir: pathlib.Path) -> list:
    path = pathlib.Path(workdir) / CONFIG_FILE
    changes = read_json(path).get(CHANGES, []) if path.is_file() else []
    if not isinstance(changes, list):
        raise ValueError(f"{path}: {CHANGES} is {changes!r}, not a list: {FIX}")
    return changes


def _model_value(workdir: pathlib.Path, field: str):
    """A moe.* field's value in the run's saved model.json (what a None in config.json meant)."""
    try:
        model = json.loads((pathlib.Path(workdir) / "model.json").read_text())
        return (model.get("moe") or {}).get(field.split(".", 1)[1])
    except (OSError, ValueError, AttributeError):
        return None


def changed(workdir: pathlib.Path, config) -> tuple[list, list]:
    """(training, neutral): the (field, old, new) where ``config`` differs from the run's saved
    config.json; fields the saved config lacks (an older run's) are not compared."""
    saved = flatten(read_config(workdir))
    new = flatten(config.to_dict())
    training, neutral = [], []
    trained_batch = read_json(pathlib.Path(workdir) / CONFIG_FILE).get(GLOBAL_BATCH)
    if trained_batch is not None:             # runs since this field: the global batch decides
        if trained_batch != global_batch_size(config):
            training.append((GLOBAL_BATCH, trained_batch, global_batch_size(config)))
        saved.pop("per_device_batch_size", None)
    for field in sorted(saved.keys() & new.keys()):
        old, value = saved[field], new[field]
        if old == value:
            continue
        if field.startswith("moe.") and None in (old, value):      # None: the model's own
            if (old if value is None else value) == _model_value(workdir, field):
                continue
        if field in NEUTRAL or NEUTRAL_BETWEEN.get(field, lambda *_: False)(old, value):
            neutral.append((field, old, value))
        else:
            training.append((field, old, value))
    return training, neutral


def describe(changes: list) -> str:
    return ", ".join(f"{field} {old!r} -> {new!r}" for field, old, new in changes)


def check_resume(workdir: pathlib.Path, config, step: int) -> list:
    """The training settings a resume from ``step`` changes; refused unless allow_changes."""
    training, _ = changed(workdir, config)
    if training and not config.get("allow_changes", False):
        raise ValueError(f"{workdir} was trained to step {step} with other settings: "
                         f"{describe(training)}; these change what is trained: resume with the "
                         "run's settings, start a new --workdir, or pass "
                         "--config.allow_changes=True to record the change at step "
                         f"{step} in config.json")
    return training


def config_text(workdir: pathlib.Path, config, start: int) -> str:
    """config.json's new text: ``config`` (the allow_changes/restore_step controls reset, as
    they act once) with the saved ``changes`` and those taking effect at ``start``."""
    changes = read_changes(workdir)
    path = pathlib.Path(workdir) / CONFIG_FILE
    if start and path.is_file():
        changes += [{"step": start, "field": f, "old": old, "new": new}
                    for f, old, new in changed(workdir, config)[0]]
    out = json.loads(config.to_json_best_effort())
    out["allow_changes"], out["restore_step"] = False, None
    out[GLOBAL_BATCH] = global_batch_size(config)
    if changes:
        out[CHANGES] = changes
    return json.dumps(out, indent=2, sort_keys=True) + "\n"


def results_names(config, workdir: pathlib.Path) -> tuple[str, str, str]:
    """(results file, translations file, what the set is) for an evaluation of ``config``:
    results.json and translations.txt for the run's own evaluation set (EVAL_SET as in its
    config.json), else results-NAME-HASH.json / translations-NAME-HASH.txt."""
    path = pathlib.Path(workdir) / CONFIG_FILE
    own = flatten(read_config(workdir)) if path.is_file() else flatten(config.to_dict())
    mine = flatten(config.to_dict())
    if all(own.get(f, mine[f]) == mine[f] for f in EVAL_SET):
        return "results.json", "translations.txt", "the run's own evaluation set"
    files = [pathlib.Path(f).expanduser() for f in mine["data.eval_files"].split(",") if f]
    parts = [[str(f.resolve()) for f in files], mine["data.eval_split"],
             mine["data.max_eval_examples"]]
    split = ""
    if mine.get("task") == "text2text":      # a fine-tune's set: its task's split or files
        task_files = [pathlib.Path(f).expanduser()
                      for f in mine["finetune.eval_files"].split(",") if f]
        files += task_files
        split = mine["finetune.eval_split"]
        parts += [[str(f.resolve()) for f in task_files], split]
    decoded = ""
    if own.get("eval.max_examples", mine["eval.max_examples"]) != mine["eval.max_examples"]:
        parts.append(mine["eval.max_examples"])
        decoded = ("perplexity_only" if mine["eval.max_examples"] == 0
                   else f"decoded{mine['eval.max_examples']}")
    key = json.dumps(parts)
    stem = (files[0].name.split(".")[0] if files else mine["data.eval_split"] or split
            or decoded or f"first{mine['data.max_eval_examples']}")
    name = re.sub(r"[^\w-]+", "_", stem)[:40] + "-" + hashlib.sha1(key.encode()).hexdigest()[:8]
    what = ", ".join(f"{f}={mine[f]!r}" for f in EVAL_SET if own.get(f, mine[f]) != mine[f])
    return f"results-{name}.json", f"translations-{name}.txt", f"another evaluation set ({what})"
