"""The training loop of a run config: mesh and layout -> data -> model -> sharded state (fresh,
from the weights init_from names: a Hugging Face directory or another run, or resumed from the
newest checkpoint) -> the loop of one jitted step (switchzoo.steps), with metrics, periodic
evaluation and asynchronous checkpoints."""
from __future__ import annotations

import contextlib
import os
import pathlib
import shutil

import jax
import numpy as np
from jax.experimental import multihost_utils

from switchzoo import (api, atomic, checkpoints, data, distill, evaluate, finetune, hosts,
                       record, resume, steps, validate, weights, zoo)
from switchzoo import metrics as metrics_lib
from switchzoo import state as state_lib
from switchzoo import upcycle as upcycle_lib
from switchzoo import workdir as workdir_lib
from switchzoo.data import feed as feed_lib
from switchzoo.data import pipeline
from switchzoo.data import tokenizer as tokenizer_lib
from switchzoo.attention_impl import attention_impl
from switchzoo.preemption import Preemption


def check_workdir(workdir: pathlib.Path, config) -> None:
    """Refuses a workdir whose checkpoints belong to another model or task, a damaged
    config.json, and a resume that changes what is trained without allow_changes
    (switchzoo.record)."""
    saved, ckpts = workdir / "config.json", workdir / "checkpoints"
    trained = sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) \
        if ckpts.is_dir() else []
    if saved.is_file():
        old = record.read_config(workdir)
        for key in ("model", "task"):
            if old.get(key) != config[key]:
                raise ValueError(f"{workdir} holds a run of {key} '{old.get(key)}', not "
                                 f"'{config[key]}'; use a new --workdir (nothing was changed)")
        if trained:                 # committed checkpoints: the record holds since then
            record.check_resume(workdir, config, config.restore_step or max(trained))
    elif trained and not config.get("allow_changes", False):
        raise ValueError(f"{workdir} has checkpoints (steps {trained[0]}..{trained[-1]}) but no "
                         "config.json, so what trained them cannot be checked against this "
                         "command: put the run's config.json back, or pass "
                         "--config.allow_changes=True to resume them with this command's "
                         "settings (recorded in a new config.json), or use a new --workdir")
    workdir.mkdir(parents=True, exist_ok=True)


class FailedStart:
    """``with FailedStart(workdir):`` around a run's start (data, tokenizer, model, state: up to
    config.json): if it fails, what it added is removed again, so a refused start leaves the
    workdir as it was (absent, or with the entries it had). Directories it created above the
    workdir go too, where they are left empty."""

    def __init__(self, workdir: pathlib.Path):
        self.workdir = workdir.absolute()
        self.created = self.workdir           # the outermost directory this run creates
        while not self.created.parent.exists() and self.created.parent != self.created:
            self.created = self.created.parent
        self.existed = self.created.exists()
        self.entries = set(os.listdir(workdir)) if workdir.is_dir() else set()

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if kind is None:
            return False
        if self.workdir.is_dir():
            for name in set(os.listdir(self.workdir)) - self.entries:
                path = self.workdir / name
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        if not self.existed:
            directory = self.workdir
            while True:               # only empty directories: another run's are left alone
                try:
                    directory.rmdir()
                except OSError:
                    break
                if directory == self.created:
                    break
                directory = directory.parent
        return False


def provisional_vocab_size(config, workdir: pathlib.Path) -> tuple[int, int | None]:
    """(ids, pieces) of the tokenizer the run will have, known before anything is built:
    data.vocab_path's, else the workdir's cached one, else a new one of data.vocab_size pieces
    plus the sentinels (what tokenizer.train makes). Reads, never writes."""
    path = pathlib.Path(config.data.vocab_path).expanduser() if config.data.vocab_path else \
        workdir / tokenizer_lib.CACHE_NAME
    if path.is_file():
        tok = tokenizer_lib.Tokenizer(path.read_bytes(), str(path))
        return tok.vocab_size, tok.num_pieces
    if config.data.vocab_path:
        raise FileNotFoundError(f"data.vocab_path {path} does not exist; give an existing "
                                "SentencePiece .model, or '' to train one in the workdir")
    return config.data.vocab_size + tokenizer_lib.EXTRA_IDS, config.data.vocab_size


def check_model(config, workdir: pathlib.Path, layout, origin) -> state_lib.Setup:
    """The refusals that need the run's model, made before anything is written (the data and a
    SentencePiece vocabulary take seconds to minutes): a moe.* flag on a dense model, routing
    settings that cannot go together (experts_choose with dropless), a vocabulary the
    checkpoint has no room for, a layout its tensors do not divide by. Returns the run's
    set-up (abstract state, shapes only) with the vocabulary the tokenizer will have."""
    vocab_size, pieces = provisional_vocab_size(config, workdir)
    cfg = state_lib.run_model_config(config, vocab_size, origin.cfg if origin else None, pieces)
    check_vocabulary(workdir, cfg)
    return state_lib.setup_run(config, layout, cfg)


def save_config(workdir: pathlib.Path, config, cfg, start: int = 0) -> list[str]:
    """The resolved run config and model (what eval.py rebuilds: a fine-tuned Hugging Face
    model is in no catalogue), written once the run is known to start (at step ``start``: the
    training settings it changes are recorded there, switchzoo.record); the lines saying so."""
    resumed = start and (workdir / "config.json").is_file()
    changes = record.changed(workdir, config)[0] if resumed else []
    atomic.write_text(workdir / "config.json", record.config_text(workdir, config, start))
    weights.write_model(workdir, cfg)
    return [f"allow_changes: recorded in {workdir / 'config.json'} from step {start}: "
            f"{record.describe(changes)}"] if changes else []


def train(config, workdir, print_fn=print, lock: bool = True) -> dict:
    """Runs (or resumes) the run of ``config`` in ``workdir``; returns the last logged row.
    The run is the workdir's one writer (it holds its lock, switchzoo.workdir, while it runs;
    ``lock`` False: train.py --nolock, on a filesystem without locks, at the user's risk), and
    takes SIGINT (Ctrl-C) as it takes SIGTERM: a preemption (Preemption)."""
    lock = workdir_lib.Lock(workdir, enabled=lock)
    try:
        with Preemption() as interrupts:
            return _train(config, workdir, print_fn, lock, interrupts)
    finally:
        lock.release()


def hold(lock: workdir_lib.Lock, lead: bool, processes: int) -> None:
    """Process 0 takes the workdir's lock (refused: another train.py holds it, or the workdir
    cannot be written); every process stops alike on a refusal, before anything is written."""
    refusal = None
    if lead:
        try:
            lock.take()
        except workdir_lib.Refused as e:
            if processes == 1:
                raise
            refusal = str(e)
    if processes > 1:
        refusal = hosts.allgather_json(refusal, processes)[0]
    if refusal:
        raise workdir_lib.Refused(refusal)


def _train(config, workdir, print_fn, lock: workdir_lib.Lock, interrupts: Preemption) -> dict:
    workdir = pathlib.Path(workdir)
    if jax.process_count() > 1:                 # first: a differing config could fail anywhere
        hosts.check_same_config(config.to_json_best_effort(sort_keys=True))
    validate.check(config)                      # settings, then the mesh: before any writing
    teacher_run = None
    if config.distill.teacher:                  # may default data.vocab_path to the teacher's
        config, teacher_run = distill.find_teacher(config, workdir)
    layout = state_lib.run_layout(config)
    state_lib.check_accumulation(config)
    zoo.entry(config.model)
    share = hosts.agreed_share(layout, state_lib.global_batch_size(config))
    lead = share.process == 0
    announce = print_fn                         # every process says which rows it reads
    if not lead:
        print_fn = lambda *_: None              # noqa: E731  (one process speaks)

    origin = weights.resolve(config.init_from) if config.init_from else None
    config = origin_vocab(config, workdir, origin)
    setup = check_model(config, workdir, layout, origin)   # before anything is written
    hold(lock, lead, share.processes)

    def build_data():
        return data.build(config.data, workdir, task=config.task, batch_size=share.rows,
                          max_length=config.max_length, seed=config.seed,
                          shards=config.data.input_shards or share.shards,
                          rows=share.row_range, run=config)
    # Process 0 writes the workdir (config, corpus, tokenizer); the others then read it. A
    # start that fails (data not prepared, a checkpoint that does not load, ...) takes back
    # what it wrote.
    with FailedStart(workdir) if lead else contextlib.nullcontext():
        if lead:
            check_workdir(workdir, config)
            ds = build_data()
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("switchzoo: workdir ready")
        if not lead:
            ds = build_data()
        cfg = state_lib.run_model_config(config, ds.tokenizer.vocab_size,
                                         origin.cfg if origin else None,
                                         ds.tokenizer.num_pieces)
        check_vocabulary(workdir, cfg)
        ckpt = checkpoints.Checkpoints(workdir / "checkpoints", config.checkpoint_every_steps,
                                       config.keep_checkpoints, writer=lead)
        latest = resume.start_step(ckpt, config.restore_step)
        if latest is not None and latest > config.num_train_steps:
            ckpt.close()          # a finished run (latest == steps) resumes and stops at once
            print_fn(f"{workdir} is already at step {latest}, past num_train_steps="
                     f"{config.num_train_steps}: nothing to train (raise "
                     f"--config.num_train_steps to train on; eval.py --workdir={workdir} "
                     "evaluates it)")
            return {}
        try:
            teacher = distill.load_teacher(teacher_run, layout, cfg) if teacher_run else None
            if cfg != setup.cfg:          # the tokenizer is not the one foreseen
                setup = state_lib.setup_run(config, layout, cfg)
            loaded = []                       # what init_from loaded: said below
            state = _initial_state(setup, ckpt, ds, origin, loaded.append,
                                   config.restore_step)
        except BaseException:
            ckpt.close()                      # no async machinery left behind a clean error
            raise
        start = int(state.step)
        started = teacher is not None and start == 0 and not config.init_from
        if started:                              # a checkpoint (or init_from) wins
            state = distill.start_from_teacher(state, teacher, print_fn)
        if lead:
            loaded += save_config(workdir, config, cfg, start)
        interrupts.begin()          # the start is complete: a signal now checkpoints a step
    schedule = state_lib.make_schedule(config.schedule, config.learning_rate, config.warmup_steps)
    print_fn(f"data: {ds.description}")
    print_fn(f"model {config.model}: {sum(x.size for x in jax.tree.leaves(state.params)):,} "
             f"parameters | mesh {dict(layout.mesh.shape)} | layout {layout.text} | "
             f"{'resuming at step ' + str(start) if start else 'from step 0'}")
    print_fn(f"attention: {attention_impl(setup.cfg)}")
    for line in loaded:
        print_fn(line)
    announce(share.describe(ds.train.num_examples, ds.train.local, ds.train.shards))
    if ds.train.reshaped or ds.train.continued:
        print_fn(ds.train.reshaped or ds.train.continued)
    if teacher is not None and config.distill.weight > 0:
        print_fn(f"distilling teacher {teacher.run.directory} (step {teacher.step}): "
                 f"{config.distill.weight:g} x its probabilities + "
                 f"{1 - config.distill.weight:g} x the labels")
    elif teacher is not None:
        # distill.weight 0: the teacher at most starts the student (its non-expert weights);
        # the step is the labels' objective alone (distill_objective at weight 0 is exactly
        # that), so it runs without the teacher, whose parameters are let go
        print_fn(f"distill.weight 0: teacher {teacher.run.directory} (step {teacher.step}) "
                 + ("started the student" if started else
                    "did not start the student (its checkpoint or init_from did)")
                 + "; the step trains on the labels alone, without the teacher")
        teacher = None
    step_fn = steps.make_train_step(setup, config.label_smoothing, config.grad_accum_steps,
                                    teacher.setup if teacher else None, config.distill.weight,
                                    config.loss_chunk)
    teacher_args = (teacher.params,) if teacher else ()    # an argument, never a constant
    # moe.straight_through_steps N > 0: the steps after the first N train the router without it
    st_last, plain = upcycle_lib.straight_through_phase(setup, origin, config.num_train_steps)
    plain_fn = step_fn if plain is None else steps.make_train_step(
        plain, config.label_smoothing, config.grad_accum_steps,
        teacher.setup if teacher else None, config.distill.weight, config.loss_chunk)
    eval_fn = steps.make_eval_step(setup)
    best = (finetune.Best(workdir, setup.cfg, lead, config.finetune.best_metric)
            if config.task == "text2text" else None)
    writer = metrics_lib.Writer(workdir, config.num_train_steps, start)
    last, throughput = {}, metrics_lib.Throughput()
    # data.prefetch: the streams read ahead in threads, and each step's input is placed on the
    # devices a step early, before the loop blocks on a step's metrics (switchzoo.data.feed)
    feed = feed_lib.Feed(ds.train, placer(layout, share, config.data.prefetch),
                         ahead=1 if config.data.prefetch else 0)
    with interrupts.training() as preempted:
        try:
            for step in range(start + 1, config.num_train_steps + 1):
                batch, placed = next(feed)          # this process's rows; the step's input
                state, m = (step_fn if step <= st_last else plain_fn)(state, placed,
                                                                      *teacher_args)
                throughput.add(m["tokens"])
                if step == start + 1:
                    throughput.restart(state)        # this process's first step: it compiled
                ckpt.check()          # a save that failed in the background stops the run now
                stopping = preempted() or ckpt.manager.reached_preemption(step)
                if stopping:
                    interrupts.saving()
                final = step == config.num_train_steps or stopping
                saving = final or ckpt.manager.should_save(step)
                if step % config.log_every_steps == 0 or saving:
                    # the loss describes the parameters before this step; the flag, after it
                    m = {**jax.device_get(m), "params_finite": steps.params_finite(state.params)}
                    check_finite(step, m)            # never checkpoint a diverged state
                    last = metrics_lib.row(step, m, float(schedule(step - 1)),
                                           throughput.rate())
                    last.update(hosts.batch_fingerprint(batch, share))
                    if ds.spans:      # texts too short to corrupt, read since this process began
                        last["skipped_documents"] = ds.spans.skipped
                    writer.write(last)
                    writer.progress(step, last["loss"], last["tokens_per_sec"])
                if config.eval_every_steps and step % config.eval_every_steps == 0:
                    row = {"step": step, **evaluate.evaluate_loss(eval_fn, state.params, ds,
                                                                  layout, share)}
                    if best is not None:      # the task's metric; the best weights kept
                        scored = finetune.score(api.Model(setup.cfg, setup.graphdef,
                                                          state.params, layout),
                                                ds, config, share, evaluate.translate)
                        row["tasks"] = finetune.public(scored)
                        row["best"] = best.offer(step, state.params, scored)
                    writer.write(row, "eval")
                    throughput.restart(state)
                if saving:                  # every process's streams, gathered
                    ckpt.save(step, state, pipeline.merge_states(
                        hosts.allgather_json(feed.get_state(), share.processes)),
                        force=final)                # the state after this step's batch
                if stopping:
                    print_fn(f"\npreempted: saved step {step}; run the same command to resume")
                    break
        finally:
            ds.train.close()                # its read-ahead threads
            writer.close()
            ckpt.close()
    return last


def placer(layout, share: hosts.Share, prefetch: int):
    """A batch of this process's rows -> the train step's input. With read-ahead: global
    jax.Arrays, placed at once (an asynchronous copy); without, as before, one process hands
    its numpy rows to the jitted step, which places them when it is dispatched."""
    if prefetch and share.processes == 1:
        shardings = state_lib.batch_shardings(layout)
        return lambda batch: jax.device_put(batch, shardings)
    return lambda batch: hosts.assemble(batch, layout, share)


def origin_vocab(config, workdir: pathlib.Path, origin):
    """A fine-tune reads its starting point's vocabulary: with init_from and no
    data.vocab_path (nor a tokenizer cached in the workdir), data.vocab_path becomes the
    origin's tokenizer (a run's, or a Hugging Face directory's spiece.model)."""
    if (origin is None or config.data.vocab_path
            or (workdir / tokenizer_lib.CACHE_NAME).is_file()):
        return config
    path = (weights.run_tokenizer(origin.path) if origin.is_workdir
            else origin.path / "spiece.model")
    if not path.is_file():
        return config
    config = config.copy_and_resolve_references()
    config.data.vocab_path = str(path.resolve())          # saved: eval.py reads it
    return config


def check_vocabulary(workdir: pathlib.Path, cfg) -> None:
    """A run resumes only with the vocabulary size it was trained with (runs from before every
    vocabulary kept 100 sentinel ids have fewer)."""
    saved = workdir / evaluate.MODEL_FILE
    if not saved.is_file() or not (workdir / "checkpoints").is_dir():
        return
    trained = weights.read_model(saved).vocab_size        # one line where it is damaged
    if trained is not None and trained != cfg.vocab_size:
        raise ValueError(f"{workdir} was trained with a vocabulary of {trained} ids, but its "
                         f"tokenizer now gives {cfg.vocab_size} (switchzoo vocabularies keep "
                         f"{tokenizer_lib.EXTRA_IDS} sentinel ids since span corruption came): "
                         "it cannot resume; start a new --workdir")


def check_finite(step: int, m: dict) -> None:
    if not np.isfinite(m["loss"]) or not m["params_finite"]:
        raise FloatingPointError(
            f"step {step}: loss is {m['loss']} (cross entropy {m['cross_entropy']}, aux "
            f"{m['aux_loss']}, z {m['z_loss']}, updated parameters finite: "
            f"{bool(m['params_finite'])}); stopped before checkpointing it, the last good "
            "checkpoint is kept (lower the learning rate or use float32)")


def _initial_state(setup: state_lib.Setup, ckpt, ds, origin: weights.Origin | None,
                   print_fn=print, restore_step: int | None = None):
    """Resume from the newest committed checkpoint (or restore_step's, switchzoo.resume); else
    start from the weights init_from names (``origin``: a Hugging Face directory or another
    run's workdir) with a fresh optimizer at step 0, saying what it loaded; else a fresh
    initialisation."""
    restored = resume.restore(ckpt, setup, restore_step, print_fn)
    if restored is not None:
        state, data_state = restored
        ds.train.set_state(data_state)
        return state
    if origin is not None:
        params = origin.load(setup)
        leaves = jax.tree.leaves(params)
        state, start = upcycle_lib.continued_state(origin, setup, setup.state_from(params))
        print_fn(f"init_from: loaded {len(leaves)} tensors ({sum(x.size for x in leaves):,} "
                 f"parameters) from {origin.describe()}; {start}")
        return state
    return setup.init()
