"""A training run from a config: mesh and layout -> data -> model -> sharded state (fresh,
fine-tuned from a Hugging Face directory, or resumed from the newest checkpoint) -> the loop of
one jitted step, with metrics, periodic evaluation and asynchronous checkpoints."""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import signal
import threading
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from switchzoo import checkpoints, cli, data, evaluation, hf, training, zoo
from switchzoo import layout as layout_lib
from switchzoo import metrics as metrics_lib
from switchzoo.config import ModelConfig


def setup_mesh(config) -> layout_lib.Layout:
    preset = layout_lib.presets().get(config.layout)
    mesh = layout_lib.make_mesh(config.mesh or (preset.mesh if preset else "data:-1"))
    return layout_lib.Layout.create(config.layout, mesh)


def model_config(config, vocab_size: int) -> ModelConfig:
    """The catalogue model with the run's overrides: MoE routing knobs, activation dtype, and a
    vocabulary sized for the tokenizer (rounded up to a multiple of 128, for sharding)."""
    cfg = zoo.get(config.model)
    want_encoder = config.task == "translation"
    if bool(cfg.num_encoder_layers) != want_encoder:
        kind = "an encoder-decoder" if want_encoder else "a decoder-only"
        raise ValueError(f"task '{config.task}' needs {kind} model; '{config.model}' is not "
                         "one (pick another --config.model)")
    overrides = {k: v for k, v in config.moe.items() if v is not None}
    if overrides:
        if cfg.moe is None:
            raise ValueError(f"--config.moe.* set for the dense model '{config.model}'; drop them")
        cfg = cfg.replace(moe=dataclasses.replace(cfg.moe, **overrides))
    if not config.init_from:
        cfg = cfg.replace(vocab_size=128 * math.ceil(vocab_size / 128))
    elif vocab_size > cfg.vocab_size:
        raise ValueError(f"the tokenizer has {vocab_size} ids but the checkpoint's vocabulary "
                         f"{cfg.vocab_size}; load the checkpoint's own SentencePiece model with "
                         "--config.data.vocab_path")
    return cfg.replace(dtype=config.dtype, dropout=config.dropout)


def check_workdir(workdir: pathlib.Path, config) -> None:
    """Refuses a workdir whose checkpoints belong to another model or task."""
    saved = workdir / "config.json"
    if saved.is_file():
        old = json.loads(saved.read_text())
        for key in ("model", "task"):
            if old.get(key) != config[key]:
                raise ValueError(f"{workdir} holds a run of {key} '{old.get(key)}', not "
                                 f"'{config[key]}'; use a new --workdir (nothing was changed)")
    workdir.mkdir(parents=True, exist_ok=True)


def save_config(workdir: pathlib.Path, config) -> None:
    """The resolved config, written once the run is known to start."""
    saved = workdir / "config.json"
    tmp = saved.with_suffix(".tmp")
    tmp.write_text(config.to_json_best_effort(indent=2, sort_keys=True) + "\n")
    tmp.replace(saved)


def batch_size(config) -> int:
    return config.per_device_batch_size * jax.device_count()


def train(config, workdir, print_fn=print) -> dict:
    """Runs (or resumes) the run of ``config`` in ``workdir``; returns the last logged row."""
    workdir = pathlib.Path(workdir)
    layout = setup_mesh(config)                 # mesh errors before anything is written
    zoo.entry(config.model)
    lead = jax.process_index() == 0
    if not lead:
        print_fn = lambda *_: None              # noqa: E731  (one process speaks)

    def build_data():
        return data.build(config.data, workdir, task=config.task, batch_size=batch_size(config),
                          max_length=config.max_length, seed=config.seed)
    # Process 0 writes the workdir (config, corpus, tokenizer); the others then read it.
    if lead:
        check_workdir(workdir, config)
        ds = build_data()
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("switchzoo: workdir ready")
    if not lead:
        ds = build_data()
    pretrained = hf.read_config(config.init_from) if config.init_from else None
    cfg = (model_config(config, ds.tokenizer.vocab_size) if pretrained is None
           else pretrained[1].replace(dtype=config.dtype, dropout=config.dropout))
    tx = training.make_optimizer(config.optimizer, config.learning_rate, config.warmup_steps,
                                 config.weight_decay)
    schedule = training.rsqrt_schedule(config.learning_rate, config.warmup_steps)
    graphdef, abstract, dims = training.abstract_state(cfg, tx, config.seed)
    shardings = training.tree_shardings(layout, abstract, dims, abstract.params,
                                        "data" if config.shard_optimizer_over_data else None)
    ckpt = checkpoints.Checkpoints(workdir / "checkpoints", config.checkpoint_every_steps,
                                   config.keep_checkpoints)
    try:
        state = _initial_state(config, cfg, tx, layout, abstract, shardings, ckpt, ds,
                               pretrained)
    except BaseException:
        ckpt.close()                          # no async machinery left behind a clean error
        raise
    start = int(state.step)
    if lead:
        save_config(workdir, config)
    print_fn(f"model {config.model}: {sum(x.size for x in jax.tree.leaves(state.params)):,} "
             f"parameters | mesh {dict(layout.mesh.shape)} | layout {layout.text} | "
             f"{'resuming at step ' + str(start) if start else 'from step 0'}")
    step_fn = training.make_train_step(graphdef, cfg, tx, layout, shardings, config.seed,
                                       config.label_smoothing, config.grad_accum_steps)
    eval_fn = training.make_eval_step(graphdef, cfg, layout, shardings.params)
    writer = metrics_lib.Writer(workdir, config.num_train_steps, start)
    last, clock = {}, time.perf_counter()
    with Preemption() as preempted:
        try:
            for step in range(start + 1, config.num_train_steps + 1):
                batch = next(ds.train)
                state, m = step_fn(state, global_batch(batch, layout))
                stopping = preempted() or ckpt.manager.reached_preemption(step)
                final = step == config.num_train_steps or stopping
                saving = final or ckpt.manager.should_save(step)
                if step % config.log_every_steps == 0 or saving:
                    m = jax.device_get(m)
                    check_finite(step, m)            # never checkpoint a diverged state
                    elapsed, clock = time.perf_counter() - clock, time.perf_counter()
                    tokens = float(m["tokens"]) * config.log_every_steps
                    last = metrics_lib.row(step, m, float(schedule(step - 1)), tokens / elapsed)
                    last["batch_sha1"] = metrics_lib.digest(batch)
                    writer.write(last)
                    writer.progress(step, last["loss"], last["tokens_per_sec"])
                if config.eval_every_steps and step % config.eval_every_steps == 0:
                    writer.write({"step": step, **evaluate_loss(eval_fn, state.params, ds, layout)},
                                 "eval")
                ckpt.save(step, state, ds.train.get_state(), force=final)
                if stopping:
                    print_fn(f"\npreempted: saved step {step}; run the same command to resume")
                    break
        finally:
            writer.close()
            ckpt.close()
    return last


def global_batch(batch: dict, layout) -> dict:
    """Every process reads the same global batch (the pipeline is deterministic); in a
    multi-process run each contributes the shards its devices hold."""
    if jax.process_count() == 1:
        return batch
    sharding = training.batch_shardings(layout)
    return {k: jax.make_array_from_callback(v.shape, sharding, lambda idx, v=v: v[idx])
            for k, v in batch.items()}


def check_finite(step: int, m: dict) -> None:
    if not np.isfinite(m["loss"]) or not m["params_finite"]:
        raise FloatingPointError(
            f"step {step}: loss is {m['loss']} (cross entropy {m['cross_entropy']}, aux "
            f"{m['aux_loss']}, z {m['z_loss']}, updated parameters finite: "
            f"{bool(m['params_finite'])}); stopped before checkpointing it, the last good "
            "checkpoint is kept (lower the learning rate or use float32)")


class Preemption:
    """SIGTERM (what schedulers send before preemption) asks the loop to checkpoint the current
    step and stop cleanly; ``with Preemption() as preempted: ... preempted()``. Multi-host runs
    leave the signal to JAX's preemption service (Orbax's reached_preemption)."""

    def __enter__(self):
        self.flag, self.previous = False, None
        if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._handle)
        return lambda: self.flag

    def _handle(self, signum, frame):
        self.flag = True

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
        return False


def _initial_state(config, cfg, tx, layout, abstract, shardings, ckpt, ds, pretrained):
    """Resume from the newest committed checkpoint; else fine-tune from a Hugging Face
    directory (``pretrained`` = hf.read_config's answer); else a fresh initialisation."""
    latest = ckpt.latest_step()
    if latest is not None:
        try:
            state, data_state = ckpt.restore(latest, abstract, shardings)
        except (ValueError, KeyError, OSError, RuntimeError, TypeError) as e:
            raise ValueError(f"checkpoint {latest} in {ckpt.directory} cannot be restored for "
                             f"this config ({cli.one_line(e)[:300]}); it was left as it is: use another "
                             "--workdir, or move the damaged step directory away") from e
        ds.train.set_state(data_state)
        return state
    if pretrained is not None:
        _, params, _ = hf.load_params(pretrained[1], pretrained[2], layout)
        init = jax.jit(lambda p: training.TrainState(jax.numpy.zeros((), jax.numpy.int32), p,
                                                     tx.init(p)), out_shardings=shardings)
        return init(params)
    return training.init_state(cfg, tx, layout, config.seed, shardings)[1]


def evaluate_loss(eval_fn, params, ds, layout) -> dict:
    """Token (and, for text with word counts, word) perplexity over the whole eval split, and
    the Switch metrics averaged over its batches."""
    totals, moe, n = {"nll": 0.0, "tokens": 0.0, "words": 0.0}, {}, 0
    for batch in ds.eval_batches():
        out = jax.device_get(eval_fn(params, global_batch(batch, layout)))
        for k in totals:
            totals[k] += float(out[k])
        for k in ("dropped_fraction", "expert_load"):
            if k in out:
                moe[k] = moe.get(k, 0) + np.asarray(out[k])
        n += 1
    result = evaluation.perplexities(totals["nll"], int(totals["tokens"]),
                                     int(totals["words"]) or None)
    for k, v in moe.items():
        result[k] = (v / n).round(5).tolist()
    return result
