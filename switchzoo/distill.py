"""Distillation (Switch Transformer paper sec. 4.2): a student (dense or sparse) trains on a mix
of the true labels and a trained teacher run's probabilities (steps.distill_objective), and a
fresh student starts from the teacher's non-expert weights.

The teacher is a switchzoo workdir: its saved config and model, its tokenizer, the parameters
of its newest checkpoint, laid out on the student's mesh and layout. Its probabilities only mean
something over the student's ids if both read text with the same tokenizer, so a student that
names none (and has none cached) reads the teacher's; any other is refused.
"""
from __future__ import annotations

import dataclasses
import pathlib

import jax
import ml_collections
import numpy as np

from switchzoo import checkpoints, evaluate, weights
from switchzoo import state as state_lib
from switchzoo.data import tokenizer as tokenizer_lib


@dataclasses.dataclass(frozen=True)
class TeacherRun:
    """A teacher workdir, checked against the student's config (nothing loaded yet)."""
    directory: pathlib.Path
    config: ml_collections.ConfigDict
    tokenizer: tokenizer_lib.Tokenizer


@dataclasses.dataclass(frozen=True)
class Teacher:
    """The teacher on the student's mesh: its set-up (parameters only), parameters and step."""
    run: TeacherRun
    setup: state_lib.Setup
    params: object
    step: int


def find_teacher(config, workdir) -> tuple[ml_collections.ConfigDict, TeacherRun]:
    """(the student's config, with data.vocab_path the teacher's tokenizer where the student
    names none and has none cached; the teacher run). Reads, never writes: a ValueError naming
    both sides for a teacher that is not a run, of another task, or with another tokenizer."""
    directory = pathlib.Path(config.distill.teacher).expanduser()
    what = f"distill.teacher {directory}"
    if not (directory / "config.json").is_file() or not (directory / "checkpoints").is_dir():
        raise ValueError(f"{what} is not a switchzoo run (a run's workdir holds config.json and "
                         "checkpoints/): give the --workdir of a trained run (for a Hugging Face "
                         "directory, train one from it first with --config.init_from=DIR)")
    teacher_config = evaluate.load_config(directory)
    ckpt = checkpoints.Checkpoints(directory / "checkpoints", 1, use_async=False)
    try:
        if ckpt.latest_step() is None:
            raise ValueError(f"{what} holds no complete checkpoint yet: train the teacher first")
    finally:
        ckpt.close()
    if teacher_config.task != config.task:
        def kind(task):
            return "decoder-only" if task == "lm" else "encoder-decoder"
        raise ValueError(f"{what} was trained on task '{teacher_config.task}' (a "
                         f"{kind(teacher_config.task)} model), the student's task is "
                         f"'{config.task}' ({kind(config.task)}): distil a teacher of the "
                         "student's own task")
    if teacher_config.scan_layers != config.scan_layers:
        raise ValueError(f"{what} has scan_layers={teacher_config.scan_layers}, the student "
                         f"{config.scan_layers}: the student starts from the teacher's weights "
                         "by parameter path, which differ between the two forms; set "
                         f"--config.scan_layers={str(teacher_config.scan_layers).lower()}")
    teacher_vocab = weights.run_tokenizer(directory)
    if not teacher_vocab.is_file():
        raise ValueError(f"{what} has no tokenizer at {teacher_vocab}: restore its tokenizer, "
                         "or give a complete run")
    teacher_tok = tokenizer_lib.Tokenizer(teacher_vocab.read_bytes(), str(teacher_vocab))
    cached = pathlib.Path(workdir) / tokenizer_lib.CACHE_NAME
    if not config.data.vocab_path and not cached.is_file():
        config = config.copy_and_resolve_references()
        config.data.vocab_path = str(teacher_vocab.resolve())    # saved: eval.py reads it
    student_vocab = pathlib.Path(config.data.vocab_path or cached).expanduser()
    if not student_vocab.is_file():
        raise ValueError(f"data.vocab_path {student_vocab} does not exist; leave it unset to "
                         f"read the teacher's tokenizer {teacher_vocab}")
    student_tok = tokenizer_lib.Tokenizer(student_vocab.read_bytes(), str(student_vocab))
    fix = (f"train the student with the teacher's tokenizer, "
           f"--config.data.vocab_path={teacher_vocab}"
           + (f" (in a new --workdir: {cached} is this run's own)"
              if student_vocab == cached else ""))
    if teacher_tok.vocab_size != student_tok.vocab_size:
        raise ValueError(f"teacher {directory} has a vocabulary of {teacher_tok.vocab_size} ids, "
                         f"the student {student_tok.vocab_size} ({student_vocab}): {fix}")
    if teacher_tok.proto != student_tok.proto:
        raise ValueError(f"teacher {directory} reads text with the tokenizer {teacher_vocab}, the "
                         f"student with another one ({student_vocab}), though both have "
                         f"{teacher_tok.vocab_size} ids (the same id would be another piece): "
                         f"{fix}")
    run = TeacherRun(directory, teacher_config, teacher_tok)
    if not config.init_from:        # else the student's model is known once init_from is read
        check_models(run, state_lib.run_model_config(config, student_tok.vocab_size, None,
                                                     student_tok.num_pieces))
    return config, run


def check_models(run: TeacherRun, student_cfg, teacher_cfg=None) -> None:
    """The teacher's output layer covers the student's ids, and both are of one kind."""
    teacher_cfg = teacher_cfg or evaluate.run_model(
        run.config, run.directory, run.tokenizer.vocab_size, run.tokenizer.num_pieces)
    if teacher_cfg.vocab_size != student_cfg.vocab_size:
        raise ValueError(f"teacher {run.directory} has an output layer of "
                         f"{teacher_cfg.vocab_size} ids, the student {student_cfg.vocab_size}, "
                         "though they share a tokenizer: start the student from a model sized "
                         "as the teacher's (its --config.init_from)")
    if teacher_cfg.is_encoder_decoder != student_cfg.is_encoder_decoder:
        kinds = {True: "an encoder-decoder", False: "a decoder-only"}
        raise ValueError(f"teacher {run.directory} is {kinds[teacher_cfg.is_encoder_decoder]} "
                         f"model, the student {kinds[student_cfg.is_encoder_decoder]} one: "
                         "distil a teacher of the student's kind")


def load_teacher(run: TeacherRun, layout, student_cfg) -> Teacher:
    """The teacher's newest checkpoint on the student's ``layout`` (its own model config and
    set-up: its dims give its shardings), checked to predict over the student's ids."""
    setup, params, step = evaluate.restore_params(run.config, run.directory, layout,
                                                  run.tokenizer.vocab_size,
                                                  run.tokenizer.num_pieces)
    check_models(run, student_cfg, setup.cfg)
    return Teacher(run, setup, params, step)


def teacher_switch_modules(dims: dict) -> set[str]:
    """The teacher's Switch layers' FFN modules (paths): the parents of every parameter with an
    'experts' dim (the experts' weights, the router and what sits inside the layer)."""
    out = set()
    for path, d in dims.items():
        if "experts" in d:
            out.add(path.rsplit("/", 1)[0])
    # the router's own module sits inside the layer's FFN: keep the outermost
    return {p for p in out if not any(p.startswith(q + "/") for q in out)}


def copy_plan(student_params, teacher_params, teacher_dims: dict) -> list[str]:
    """Paths of the student's parameters to copy from the teacher: those whose path and shape
    the teacher has, outside the teacher's Switch layers (the paper's "non-expert weights"):
    attention, embeddings, norms, relative-position biases and the dense FFNs between the
    Switch layers."""
    teacher = {state_lib.path_name(p): x.shape
               for p, x in jax.tree_util.tree_leaves_with_path(teacher_params)}
    switch = teacher_switch_modules(teacher_dims)
    plan = []
    for p, x in jax.tree_util.tree_leaves_with_path(student_params):
        name = state_lib.path_name(p)
        if teacher.get(name) == x.shape and not any(name.startswith(m + "/") for m in switch):
            plan.append(name)
    return plan


def copy_from_teacher(student_params, teacher_params, teacher_dims: dict):
    """(the student's parameters with copy_plan's taken from the teacher, bitwise, in the
    student's shardings and dtypes; the copied paths). Fresh buffers: the student's state is
    donated to each step, the teacher's parameters must outlive it."""
    plan = set(copy_plan(student_params, teacher_params, teacher_dims))
    teacher = {state_lib.path_name(p): x
               for p, x in jax.tree_util.tree_leaves_with_path(teacher_params)}

    def one(path, x):
        name = state_lib.path_name(path)
        if name not in plan:
            return x
        t = teacher[name].astype(x.dtype)
        if isinstance(x, jax.Array):
            return jax.device_put(t, x.sharding, may_alias=False)
        return np.array(t)
    return jax.tree_util.tree_map_with_path(one, student_params), sorted(plan)


def start_from_teacher(state: state_lib.TrainState, teacher: Teacher,
                       print_fn=print) -> state_lib.TrainState:
    """A fresh student's step-0 state with the teacher's non-expert weights (the optimizer
    state at step 0 depends on no parameter's value)."""
    params, copied = copy_from_teacher(state.params, teacher.params, teacher.setup.dims)
    leaves = {state_lib.path_name(p): x.size
              for p, x in jax.tree_util.tree_leaves_with_path(state.params)}
    print_fn(f"distill: copied {len(copied)} of {len(leaves)} tensors "
             f"({sum(leaves[p] for p in copied):,} of {sum(leaves.values()):,} parameters) from "
             f"teacher {teacher.run.directory} step {teacher.step}; the rest (the FFNs at its "
             "Switch layers, and any it lacks) keep their fresh initialisation")
    return state._replace(params=params)
