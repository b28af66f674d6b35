"""The model's state on the mesh, set up one way for every caller.

``setup`` goes from a model (catalogue name or ModelConfig), a layout and a mesh (and, for
training, an optimizer) to everything a program over the state needs: the mesh and layout, the
model config, the graph definition, the abstract state (shapes only, nothing allocated), each
parameter's logical dims and the shardings of the whole state. The run loop, evaluation, the
layout inspector, the Python API, Hugging Face loading and the benchmarks all start here;
``setup_run`` translates a run config into its arguments.

Parameter paths are strings, ``decoder/layers/1/ffn/wi`` (jax.tree_util.keystr's simple form).
"""
from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from switchzoo import layout as layout_lib
from switchzoo import draws as draws_lib
from switchzoo import pipeline, scanned, tasks, transformer, zoo
from switchzoo.config import ModelConfig
# The optimizers live in switchzoo.optim; re-exported, as the set-up and its callers use them.
from switchzoo.optim import (BATCH_DIMS, SCHEDULES, batch_dims, bias_update,  # noqa: F401
                             freeze_routers, linear_rsqrt_schedule, make_optimizer,
                             make_schedule, moment, momentum_of_experts, per_layer,
                             rsqrt_schedule, scale_routers)
from switchzoo.paths import path_name      # also state.path_name, as its callers use it


class TrainState(NamedTuple):
    step: jax.Array
    params: nnx.State
    opt_state: optax.OptState


# ------------------------------------------------------------------------- paths and dims

def module_dims(module: nnx.Module) -> dict[str, tuple[str, ...]]:
    """{parameter path: its logical dims} from the ``dims`` annotations."""
    return {path_name(path): v.get_metadata()["dims"]
            for path, v in nnx.to_flat_state(nnx.state(module))}


def abstract_model(cfg: ModelConfig, seed: int = 0, record: list | None = None):
    """(graphdef, abstract params as a pure dict, dims) without allocating anything;
    ``record`` (a list) gets the parameters' random draws (draws.Draw), in order."""
    with draws_lib.drawing(record=record):
        model = nnx.eval_shape(lambda: transformer.build(cfg, seed))
    graphdef, state = nnx.split(model)
    return graphdef, nnx.to_pure_dict(state), module_dims(model)


def tree_shardings(layout: layout_lib.Layout, tree, dims: dict, params,
                   update_axis: str | None = None):
    """NamedSharding per leaf of ``tree`` (params, optimizer state, or a whole TrainState).

    A leaf whose key path ends with a parameter's path and has that parameter's shape follows
    its dims (so Adam moments shard like their weights); Adafactor's factored row / column
    statistics follow their weight's dims less the one averaged away; everything else
    (counters, placeholders) is replicated. With ``update_axis`` (e.g. "data"), the
    optimizer state is further split over that axis where a free dimension divides: the
    weight-update sharding of arXiv 2004.13336 (each data replica updates a slice, then the
    parameters are all-gathered).
    """
    shapes = {path_name(p): x.shape for p, x in jax.tree_util.tree_leaves_with_path(params)}

    def one(path, leaf):
        keys = path_name(path).split("/")
        for start in range(len(keys)):
            name = "/".join(keys[start:])
            d = dims.get(name)
            if d is None:
                continue
            if shapes[name] == leaf.shape:
                s = layout.sharding(d, leaf.shape, name)
                if update_axis and keys[0] == "opt_state":
                    s = _split_further(s, leaf.shape, update_axis)
                return s
            dropped = _factored_dim(keys, shapes[name], leaf.shape, batch_dims(d))
            if dropped is not None:    # a factored statistic: its weight's dims less one
                return layout.sharding(d[:dropped] + d[dropped + 1:], leaf.shape, name)
        return layout.replicated()
    return jax.tree_util.tree_map_with_path(one, tree)


def _factored_dim(keys, param_shape, shape, batch: int = 0) -> int | None:
    """Which dim of ``param_shape`` a factored second-moment statistic of that shape averages
    away: optax's adafactor keeps v_row without the largest dim of the array it updates and
    v_col without the second largest (``np.argsort`` order); that array is the slice after the
    ``batch`` leading dims the optimizer runs over (per_layer). None if ``shape`` is not such a
    statistic."""
    if len(shape) != len(param_shape) - 1 or len(param_shape) - batch < 2:
        return None
    order = batch + np.argsort(param_shape[batch:])
    dim = {"v_row": order[-1], "v_col": order[-2]}.get(next(
        (k for k in keys if k in ("v_row", "v_col")), None))
    if dim is None or tuple(np.delete(param_shape, dim)) != tuple(shape):
        return None
    return int(dim)


def _split_further(sharding: NamedSharding, shape, axis: str) -> NamedSharding:
    """Adds mesh ``axis`` to the first dimension it divides, if the tensor does not use it."""
    mesh = sharding.mesh
    if axis not in mesh.shape or mesh.shape[axis] == 1:
        return sharding
    spec = list(sharding.spec) + [None] * (len(shape) - len(sharding.spec))
    used = {a for e in spec for a in layout_lib.spec_axes(e)}
    if axis in used:
        return sharding
    for i, e in enumerate(spec):
        axes = layout_lib.spec_axes(e)
        parts = math.prod(mesh.shape[a] for a in axes) * mesh.shape[axis]
        if shape[i] % parts == 0:
            spec[i] = axes + (axis,) if axes else axis
            return NamedSharding(mesh, P(*spec))
    return sharding


def batch_shardings(layout: layout_lib.Layout):
    """Batch fields are [batch, length] (or [batch]): split along the batch, as the layout says.
    (A PartitionSpec names leading dims only, so one sharding serves both ranks.)"""
    return NamedSharding(layout.mesh, P(*layout.spec(("batch",), strict=False)))


# ------------------------------------------------------------------------ the one set-up

@dataclasses.dataclass(frozen=True)
class Setup:
    """A model laid out on a mesh. ``abstract`` and ``shardings`` are a TrainState when there
    is an optimizer (``tx``), else the parameters alone."""
    cfg: ModelConfig
    layout: layout_lib.Layout
    graphdef: nnx.GraphDef
    dims: dict
    abstract: object
    shardings: object
    tx: optax.GradientTransformation | None = None
    seed: int = 0
    draws: tuple = ()          # the parameters' random draws (draws.Draw), as build makes them

    @property
    def mesh(self) -> jax.sharding.Mesh:
        return self.layout.mesh

    @property
    def abstract_params(self):
        return self.abstract.params if self.tx is not None else self.abstract

    @property
    def param_shardings(self):
        return self.shardings.params if self.tx is not None else self.shardings

    def _around(self, params):
        """``params`` as this set-up holds them: alone, or in a TrainState at step 0."""
        if self.tx is None:
            return params
        return TrainState(jnp.zeros((), jnp.int32), params, self.tx.init(params))

    def init(self):
        """A fresh state (or parameters, without an optimizer), born in its shardings. The
        parameters' random draws are batched (draws.draw_all): the weights
        ``transformer.build(cfg, seed)`` draws, in a program that compiles faster."""
        cfg, seed, draws = self.cfg, self.seed, list(self.draws)
        if not draws:                                   # a Setup made without setup()
            abstract_model(cfg, seed, record=draws)

        def fresh():
            with draws_lib.drawing(supply=iter(draws_lib.draw_all(draws, seed))):
                return self._around(nnx.to_pure_dict(nnx.state(transformer.build(cfg, seed))))
        return jax.jit(fresh, out_shardings=self.shardings)()

    def state_from(self, params):
        """The state at step 0 around ``params`` (e.g. loaded from Hugging Face)."""
        return jax.jit(self._around, out_shardings=self.shardings)(params)


def setup(model: str | ModelConfig, layout: str | layout_lib.Layout | None = "data_parallel",
          mesh: str | jax.sharding.Mesh | None = None, *, devices=None,
          optimizer: str | optax.GradientTransformation | None = None, seed: int = 0,
          update_axis: str | None = None, router_lr_scale: float = 1.0,
          expert_momentum: float = 0.0, router_freeze_step: int = 0) -> Setup:
    """The model (a catalogue name or a ModelConfig) laid out by ``layout`` (a Layout, a preset
    name or a layout string) on ``mesh`` (a Mesh, a mesh spec, or None: the preset's mesh, else
    every device on 'data'). ``optimizer`` (a name or an optax transformation) adds its state;
    ``update_axis`` splits that state further (weight-update sharding); ``router_lr_scale``
    multiplies the routers' updates (scale_routers); ``expert_momentum`` (> 0) averages the
    experts' updates over steps with that decay (momentum_of_experts); ``router_freeze_step``
    (> 0) stops the routers' updates from that step on (freeze_routers). Nothing is
    allocated."""
    cfg = zoo.get(model) if isinstance(model, str) else model
    if not isinstance(layout, layout_lib.Layout):
        layout = make_layout(layout, mesh, devices)
    tx = make_optimizer(optimizer) if isinstance(optimizer, str) else optimizer
    pipeline.check(layout, cfg, scanned.groups(cfg))
    draws: list = []
    graphdef, params, dims = abstract_model(cfg, seed, record=draws)
    if tx is None:
        abstract = params
    else:
        tx = per_layer(tx, params, cfg.moe.bias_rate if cfg.moe else 0.0, dims)
        if router_lr_scale != 1.0:
            tx = optax.chain(tx, scale_routers(router_lr_scale))
        if expert_momentum:
            tx = optax.chain(tx, momentum_of_experts(expert_momentum, params, dims))
        if router_freeze_step:
            tx = optax.chain(tx, freeze_routers(router_freeze_step))
        abstract = TrainState(jax.ShapeDtypeStruct((), jnp.int32), params,
                              jax.eval_shape(tx.init, params))
    shardings = tree_shardings(layout, abstract, dims, params, update_axis)
    return Setup(cfg, layout, graphdef, dims, abstract, shardings, tx, seed, tuple(draws))


def make_layout(layout: str | None = "data_parallel", mesh=None,
                devices=None) -> layout_lib.Layout:
    """A preset or layout string (None: data_parallel) on a Mesh or mesh spec; without a mesh,
    the preset's, else every device on the 'data' axis."""
    layout = layout or "data_parallel"
    if mesh is None or mesh == "":
        preset = layout_lib.presets().get(layout)
        mesh = preset.mesh if preset else "data:-1"
    if isinstance(mesh, str):
        mesh = layout_lib.make_mesh(mesh, devices)
    return layout_lib.Layout.create(layout, mesh)


# ---------------------------------------------------------------------------- run configs

def run_layout(config) -> layout_lib.Layout:
    """The mesh and layout a run config asks for (errors before anything is written). A mesh
    this machine's devices cannot hold (a paper config's pod mesh) says how to run it here."""
    try:
        return make_layout(config.layout, config.mesh or None)
    except layout_lib.DeviceCountError as e:
        raise layout_lib.DeviceCountError(
            f"{e}; on this machine, `train.py ... --dry_run` compiles the step for that mesh "
            "on simulated devices, and --config.mesh=data:-1,model:1,expert:1 trains on the "
            f"{jax.device_count()} device(s) it has") from None


def check_accumulation(config, batch: int | None = None) -> None:
    """grad_accum_steps must be >= 1 and divide the global batch (``batch`` rows, default this
    machine's; checked before anything is written; steps.micro_batches checks the arrays)."""
    accumulate = config.grad_accum_steps
    batch = global_batch_size(config) if batch is None else batch
    if accumulate < 1 or batch % accumulate:
        raise ValueError(f"grad_accum_steps={accumulate} must be >= 1 and divide the global "
                         f"batch of {batch} rows (per_device_batch_size x devices)")


def run_model_config(config, vocab_size: int, model: ModelConfig | None = None,
                     pieces: int | None = None) -> ModelConfig:
    """The run's model: ``model`` (a Hugging Face checkpoint's, or the one a run saved) or the
    catalogue's, with the run's overrides: MoE routing knobs, activation dtype, dropout, layer
    scanning and rematerialisation, and for a catalogue model a vocabulary sized for the
    tokenizer's ``vocab_size`` ids (rounded up to a multiple of 128, for sharding). ``pieces``:
    the tokenizer's ids without the sentinels it adds, to name a model that has room for those
    but not for them."""
    cfg = model or zoo.get(config.model)
    want_encoder = config.task != "lm"            # translation, span corruption
    if cfg.is_encoder_decoder != want_encoder:
        kind = "an encoder-decoder" if want_encoder else "a decoder-only"
        what = f"'{config.model}'" if model is None else "the checkpoint's model"
        raise ValueError(f"task '{config.task}' needs {kind} model; {what} is not one (pick "
                         "another --config.model or --config.task)")
    overrides = {k: v for k, v in config.moe.items() if v is not None}
    finetune = config.get("finetune")
    recipe_changed = finetune.expert_dropout != tasks.default_config().expert_dropout
    if config.task == "text2text" and cfg.moe is None and recipe_changed:
        raise ValueError(f"--config.finetune.expert_dropout={finetune.expert_dropout} set for a "
                         "dense model, which has no experts; drop the flag")
    if config.task == "text2text" and cfg.moe is not None:
        if "expert_dropout" in overrides and recipe_changed:
            raise ValueError("--config.moe.expert_dropout and --config.finetune.expert_dropout "
                             "both set; set one (the fine-tune's is the recipe's 0.4)")
        overrides.setdefault("expert_dropout", finetune.expert_dropout)   # the recipe's
    if cfg.moe is None and config.router_learning_rate_scale != 1.0:
        raise ValueError("--config.router_learning_rate_scale set for a dense model, which has "
                         "no routers; drop the flag")
    if cfg.moe is None and config.router_freeze_step:
        raise ValueError("--config.router_freeze_step set for a dense model, which has no "
                         "routers; drop the flag")
    if config.router_freeze_step >= config.num_train_steps:
        raise ValueError(f"--config.router_freeze_step={config.router_freeze_step} is not "
                         f"before the run's last step ({config.num_train_steps}): the routers "
                         "would never freeze; set a step below --config.num_train_steps or 0")
    if config.momentum and config.optimizer != "adafactor":
        raise ValueError(f"--config.momentum is Adafactor's first moment; {config.optimizer} "
                         "keeps its own (b1 0.9): drop the flag or use "
                         "--config.optimizer=adafactor")
    if config.expert_momentum:
        if config.momentum:
            raise ValueError("--config.momentum already averages every update, the experts' "
                             "too; set it or --config.expert_momentum, not both")
        if cfg.moe is None:
            raise ValueError("--config.expert_momentum set for a dense model, which has no "
                             "experts; drop the flag")
        if config.optimizer != "adafactor":
            raise ValueError(f"--config.expert_momentum is Adafactor's first moment; "
                             f"{config.optimizer} keeps its own (b1 0.9): drop the flag or "
                             "use --config.optimizer=adafactor")
    if overrides:
        if cfg.moe is None:
            what = f"model '{config.model}'" if model is None else "checkpoint's model"
            raise ValueError(f"--config.moe.{sorted(overrides)[0]} set for the dense {what}, "
                             "which has no Switch layers; drop the --config.moe.* flags")
        adding = sorted(k for k in ("balance", "num_shared_experts")
                        if k in overrides and overrides[k] != getattr(cfg.moe, k))
        if model is not None and adding:
            raise ValueError(f"--config.moe.{adding[0]}={overrides[adding[0]]!r} changes which "
                             "parameters the checkpoint's model has (a balancing bias, shared "
                             "experts), which init_from cannot load; drop the flag, or train "
                             "such a model from a catalogue name")
        if {"train_capacity_factor", "eval_capacity_factor"} & overrides.keys():
            overrides["expert_capacity"] = None     # the factors replace a checkpoint's slots
        cfg = cfg.replace(moe=dataclasses.replace(cfg.moe, **overrides))
    if model is None:
        cfg = cfg.replace(vocab_size=128 * math.ceil(vocab_size / 128))
    elif vocab_size > cfg.vocab_size:
        if pieces is not None and pieces <= cfg.vocab_size:
            raise ValueError(
                f"the model's vocabulary has {cfg.vocab_size} ids: room for the tokenizer's "
                f"{pieces} pieces but not for the {vocab_size - pieces} sentinel ids "
                "every switchzoo vocabulary now keeps above them (a run trained before they "
                "were added, or a checkpoint sized without them); train a new run, or "
                "evaluate this one with the switchzoo version that trained it")
        raise ValueError(f"the tokenizer has {vocab_size} ids but the checkpoint's vocabulary "
                         f"{cfg.vocab_size}; load the checkpoint's own SentencePiece model with "
                         "--config.data.vocab_path")
    init = {k: config[k] for k in ("init_scale", "init_distribution") if config[k] is not None}
    return cfg.replace(dtype=config.dtype, dropout=config.dropout,
                       scan_layers=config.scan_layers, remat=config.remat,
                       attention=config.attention,
                       pipeline_microbatches=config.pipeline_microbatches,
                       pipeline_repeats=config.pipeline_repeats, **init)


def run_optimizer(config) -> optax.GradientTransformation:
    return make_optimizer(config.optimizer, config.learning_rate, config.warmup_steps,
                          config.weight_decay, config.schedule, config.momentum,
                          config.moments_dtype)


def setup_run(config, layout: layout_lib.Layout, cfg: ModelConfig,
              train: bool = True) -> Setup:
    """``setup`` for a run config: its optimizer (``train``; else the parameters alone), seed
    and weight-update sharding, on ``layout`` (run_layout) with model ``cfg``
    (run_model_config, or a Hugging Face checkpoint's)."""
    pipeline.check(layout, cfg, scanned.groups(cfg),
                   global_batch_size(config) // config.grad_accum_steps)
    return setup(cfg, layout, optimizer=run_optimizer(config) if train else None,
                 seed=config.seed,
                 update_axis="data" if train and config.shard_optimizer_over_data else None,
                 router_lr_scale=config.router_learning_rate_scale,
                 expert_momentum=config.expert_momentum,
                 router_freeze_step=config.router_freeze_step)


def global_batch_size(config) -> int:
    return config.per_device_batch_size * jax.device_count()
