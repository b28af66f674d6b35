"""Use what you trained: a run's outputs for your own inputs, one per line.

    python eval.py --workdir=DIR --predict=inputs.txt [--predictions=out.txt]   # "-": stdin/out

A translator translates each line (beam search, config.eval's settings). A fine-tuned model
(task=text2text) reads each line as its task's input text (a plain line fills the task's one
input column; a JSON object line names the columns of a task with several, e.g. MNLI's premise
and hypothesis), writes its greedy output for it, and scores nothing. A fine-tune is read at its
best checkpoint (workdir/best/), as eval.py scores it.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import string
import sys

from switchzoo import api, evaluate, finetune, hosts, tasks, weights
from switchzoo import state as state_lib
from switchzoo.data import tokenizer as tokenizer_lib


@dataclasses.dataclass
class _Texts:
    tokenizer: tokenizer_lib.Tokenizer      # what evaluate.translate reads of a dataset


def input_column(task: tasks.Task, config) -> str | None:
    """The one column a task's input is made of, where it has one."""
    if task.name == tasks.FILES:
        names = {field for _, field, _, _ in string.Formatter().parse(config.finetune.inputs)
                 if field}
        return names.pop() if len(names) == 1 else None
    return task.columns[0] if len(task.columns) == 1 else None


def task_inputs(task: tasks.Task, lines: list[str], where: str, config) -> list[str]:
    column = input_column(task, config)
    out = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line) if line.lstrip().startswith("{") else None
        except json.JSONDecodeError:
            row = None
        if row is None:
            if column is None:
                raise ValueError(f"{where}:{number}: task {task.name} reads several columns "
                                 f"({', '.join(task.columns) or 'its template'}); write each "
                                 "input as a JSON object naming them")
            row = {column: line}
        row["_where"] = f"{where}:{number}"
        if task.name == tasks.FILES:         # the input template alone: no target column
            out.append(config.finetune.inputs.format_map(tasks.Columns(row, None)))
        else:
            row.setdefault("label", -1)      # T5's "no answer" (the inputs do not read it)
            out.append(task.preprocess(row).inputs)
    return out


def run(config, workdir, inputs: str, predictions: str = "-", checkpoint: str = "",
        print_fn=print) -> list[str]:
    workdir = pathlib.Path(workdir)
    where = "stdin" if inputs == "-" else inputs
    text = sys.stdin.read() if inputs == "-" else pathlib.Path(inputs).expanduser().read_text(
        encoding="utf-8")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"--predict {where} holds no inputs; give one input per line")
    if config.task not in ("translation", "text2text"):
        raise ValueError(f"--predict writes outputs of a translation or text2text run; this "
                         f"run's task is {config.task} (score it with eval.py --workdir)")
    layout = state_lib.run_layout(config)
    share = hosts.agreed_share(layout, state_lib.global_batch_size(config))
    tok = tokenizer_lib.load_or_train(config.data, workdir, None)
    if not checkpoint and config.task == "text2text" and finetune.best_record(workdir):
        checkpoint = str(workdir / weights.BEST_DIR)
    if checkpoint:
        origin = weights.resolve(checkpoint)
        setup = state_lib.setup(state_lib.run_model_config(config, tok.vocab_size, origin.cfg),
                                layout)
        params = origin.load(setup)
    else:
        setup, params, _ = evaluate.restore_params(config, workdir, layout, tok.vocab_size,
                                                   tok.num_pieces)
    model = api.Model(setup.cfg, setup.graphdef, params, layout)
    if config.task == "text2text":
        members = tasks.resolve(config.finetune)
        if len(members) > 1:
            raise ValueError(f"--predict reads the inputs of one task; this run fine-tuned the "
                             f"mixture {config.finetune.task} ({len(members)} tasks), whose "
                             "inputs name no task: score its members with eval.py instead")
        (task,) = members
        inputs_ = task_inputs(task, lines, where, config)
        outs = evaluate.translate(model, _Texts(tok), inputs_, config,
                                  share, max_new=task.max_target_length, beams=1)
    else:
        outs = evaluate.translate(model, _Texts(tok), lines, config, share)
    outs = [" ".join(o.split()) for o in outs]
    if share.process == 0:
        if predictions == "-":
            for o in outs:
                print_fn(o)
        else:
            pathlib.Path(predictions).expanduser().write_text("".join(o + "\n" for o in outs),
                                                              encoding="utf-8")
    return outs
