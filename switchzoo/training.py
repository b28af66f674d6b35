"""Train state, the sharded train step, and a short training loop.

Shardings come from one place: eval_shape -> each Variable's ``dims`` -> layout -> jit(init).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from switchzoo import layout as layout_lib
from switchzoo import transformer
from switchzoo.config import ModelConfig


class TrainState(NamedTuple):
    step: jax.Array
    params: nnx.State
    opt_state: optax.OptState


def rsqrt_schedule(learning_rate: float, warmup_steps: int):
    """The T5 schedule: linear warmup to ``learning_rate``, then decay as 1/sqrt(step)."""
    warmup = max(warmup_steps, 1)

    def schedule(step):
        step = jnp.maximum(step, 1).astype(jnp.float32)
        return learning_rate * jnp.minimum(step / warmup, jnp.sqrt(warmup / step))
    return schedule


def make_optimizer(name: str = "adamw", learning_rate: float = 1e-3, warmup_steps: int = 100,
                   weight_decay: float = 0.0) -> optax.GradientTransformation:
    """AdamW or Adafactor under the rsqrt schedule."""
    schedule = rsqrt_schedule(learning_rate, warmup_steps)
    if name == "adamw":
        return optax.adamw(schedule, b1=0.9, b2=0.98, weight_decay=weight_decay)
    if name == "adafactor":
        return optax.adafactor(schedule)
    raise ValueError(f"unknown optimizer '{name}'; use 'adamw' or 'adafactor'")


def _key(k):
    return getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))


def module_dims(module: nnx.Module) -> dict[tuple, tuple[str, ...]]:
    """{parameter path: its logical dims} from the ``dims`` annotations."""
    return {tuple(map(_key, path)): v.get_metadata()["dims"]
            for path, v in nnx.to_flat_state(nnx.state(module))}


def abstract_model(cfg: ModelConfig, seed: int = 0):
    """(graphdef, abstract params as a pure dict, dims) without allocating anything."""
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
    shapes = {tuple(map(_key, p)): x.shape for p, x in jax.tree_util.tree_leaves_with_path(params)}

    def one(path, leaf):
        keys = tuple(map(_key, path))
        for start in range(len(keys)):
            d = dims.get(keys[start:])
            if d is None:
                continue
            name = "/".join(map(str, keys[start:]))
            if shapes[keys[start:]] == leaf.shape:
                s = layout.sharding(d, leaf.shape, name)
                if update_axis and keys[0] == "opt_state":
                    s = _split_further(s, leaf.shape, update_axis)
                return s
            dropped = _factored_dim(keys, shapes[keys[start:]], leaf.shape)
            if dropped is not None:    # a factored statistic: its weight's dims less one
                return layout.sharding(d[:dropped] + d[dropped + 1:], leaf.shape, name)
        return layout.replicated()
    return jax.tree_util.tree_map_with_path(one, tree)


def _factored_dim(keys, param_shape, shape) -> int | None:
    """Which dim of ``param_shape`` a factored second-moment statistic of that shape averages
    away: optax's adafactor keeps v_row without the largest dim and v_col without the second
    largest (``np.argsort`` order); None if ``shape`` is not such a statistic."""
    if len(shape) != len(param_shape) - 1 or len(param_shape) < 2:
        return None
    order = np.argsort(param_shape)
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


def abstract_state(cfg: ModelConfig, tx, seed: int = 0):
    """(graphdef, TrainState of ShapeDtypeStructs, dims) without allocating anything."""
    graphdef, params, dims = abstract_model(cfg, seed)
    opt_state = jax.eval_shape(tx.init, params)
    return graphdef, TrainState(jax.ShapeDtypeStruct((), jnp.int32), params, opt_state), dims


def init_state(cfg: ModelConfig, tx, layout: layout_lib.Layout, seed: int = 0, shardings=None):
    """Initialises the state directly into its shardings (by default the layout's). Returns
    (graphdef, state, shardings)."""
    graphdef, abstract, dims = abstract_state(cfg, tx, seed)
    if shardings is None:
        shardings = tree_shardings(layout, abstract, dims, abstract.params)

    def init():
        params = nnx.to_pure_dict(nnx.state(transformer.build(cfg, seed)))
        return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    return graphdef, jax.jit(init, out_shardings=shardings)(), shardings


def lm_objective(logits_BLV, batch, aux, cfg: ModelConfig, label_smoothing: float = 0.0):
    """Cross-entropy (with optional label smoothing) + weighted aux and z losses."""
    targets_BL, weights_BL = batch["targets"], batch["weights"].astype(jnp.float32)
    # -sum(smoothed one-hot * log_softmax) without building the one-hot [B, L, V]: the
    # smoothed target puts 1 - s on the label and s / V everywhere.
    logits_BLV = logits_BLV.astype(jnp.float32)
    lse_BL = jax.nn.logsumexp(logits_BLV, axis=-1)
    label_BL = jnp.take_along_axis(logits_BLV, targets_BL[..., None], axis=-1)[..., 0]
    ce_BL = lse_BL - label_BL
    if label_smoothing:
        ce_BL = lse_BL - (1 - label_smoothing) * label_BL - label_smoothing * jnp.mean(
            logits_BLV, axis=-1)
    tokens = jnp.maximum(jnp.sum(weights_BL), 1.0)
    ce = jnp.sum(ce_BL * weights_BL) / tokens
    loss = ce
    if cfg.moe is not None:
        loss = loss + cfg.moe.aux_loss_weight * aux["aux_loss"] + cfg.moe.z_loss_weight * aux["z_loss"]
    accuracy = jnp.sum((jnp.argmax(logits_BLV, -1) == targets_BL) * weights_BL) / tokens
    return loss, {"loss": loss, "cross_entropy": ce, "accuracy": accuracy, "tokens": tokens, **aux}


def make_loss_fn(graphdef, cfg: ModelConfig, layout: layout_lib.Layout, seed: int = 0,
                 label_smoothing: float = 0.0):
    """loss_fn(params, batch, step) -> (loss, metrics); dropout/jitter keys derive from step.

    Decoder-only: ``inputs`` predict ``targets``. Encoder-decoder: ``inputs`` are the source and
    the decoder reads ``targets`` shifted right (T5: starting with the pad id 0)."""
    def loss_fn(params, batch, step):
        rng = jax.random.fold_in(jax.random.key(seed + 1), step)
        logits, aux = forward(nnx.merge(graphdef, params), cfg, layout, batch, rng)
        return lm_objective(logits, batch, aux, cfg, label_smoothing)
    return loss_fn


def forward(model, cfg: ModelConfig, layout: layout_lib.Layout, batch, rng=None):
    """Logits and Switch stats of a batch (``rng`` None: evaluation mode)."""
    with layout_lib.use(layout):
        if cfg.num_encoder_layers:
            return model(batch["inputs"],
                         shift_right(batch["targets"], batch.get("targets_segments")),
                         src_positions=batch.get("inputs_positions"),
                         src_segments=batch.get("inputs_segments"),
                         tgt_positions=batch.get("targets_positions"),
                         tgt_segments=batch.get("targets_segments"), rng=rng)
        return model(batch["inputs"], positions_BL=batch.get("positions"),
                     segments_BL=batch.get("segments"), rng=rng)


def make_eval_step(graphdef, cfg: ModelConfig, layout: layout_lib.Layout, param_shardings):
    """Jitted eval_step(params, batch) -> sums over the batch: nll, tokens, words, and the
    Switch metrics at the evaluation capacity factor."""
    def eval_step(params, batch):
        logits_BLV, aux = forward(nnx.merge(graphdef, params), cfg, layout, batch)
        weights_BL = batch["weights"].astype(jnp.float32)
        logp_BLV = jax.nn.log_softmax(logits_BLV, axis=-1)
        nll_BL = -jnp.take_along_axis(logp_BLV, batch["targets"][..., None], -1)[..., 0]
        out = {"nll": jnp.sum(nll_BL * weights_BL), "tokens": jnp.sum(weights_BL),
               "words": jnp.sum(batch.get("num_words", jnp.zeros((1,), jnp.int32)))}
        for key in ("dropped_fraction", "expert_load"):
            if key in aux:
                out[key] = aux[key]
        return out
    return jax.jit(eval_step, in_shardings=(param_shardings, batch_shardings(layout)))


def shift_right(targets_BT, segments_BT=None):
    """Decoder inputs: the targets one step later, starting with the pad id 0 (and, in packed
    rows, restarting at 0 where each example begins)."""
    shifted = jnp.pad(targets_BT, ((0, 0), (1, 0)))[:, :-1]
    if segments_BT is None:
        return shifted
    starts = segments_BT != jnp.pad(segments_BT, ((0, 0), (1, 0)))[:, :-1]
    return jnp.where(starts, 0, shifted)


def make_train_step(graphdef, cfg: ModelConfig, tx, layout: layout_lib.Layout, shardings,
                    seed: int = 0, label_smoothing: float = 0.0, accumulate: int = 1):
    """The one jitted step: loss, gradients (averaged over ``accumulate`` micro-batches),
    optimizer update. The state is donated; batch fields are [batch, ...] arrays."""
    loss_fn = make_loss_fn(graphdef, cfg, layout, seed, label_smoothing)
    grad_fn = jax.grad(loss_fn, has_aux=True)

    def train_step(state: TrainState, batch):
        if accumulate == 1:
            grads, metrics = grad_fn(state.params, batch, state.step)
        else:
            micro = jax.tree.map(lambda x: x.reshape((accumulate, -1) + x.shape[1:]), batch)

            def add(total, mb):
                g, m = grad_fn(state.params, mb, state.step)
                return jax.tree.map(jnp.add, total, (g, m)), None
            zero = jax.eval_shape(grad_fn, state.params, jax.tree.map(lambda x: x[0], micro),
                                  state.step)
            zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zero)
            (grads, metrics), _ = jax.lax.scan(add, zero, micro)
            grads, metrics = jax.tree.map(lambda x: x / accumulate, (grads, metrics))
            metrics["tokens"] = metrics["tokens"] * accumulate
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        # The loss describes the parameters before this update; this flag, the ones after it.
        metrics["params_finite"] = jnp.all(jnp.stack(
            [jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(params)]))
        return TrainState(state.step + 1, params, opt_state), metrics

    return jax.jit(train_step, in_shardings=(shardings, batch_shardings(layout)),
                   out_shardings=(shardings, layout.replicated()), donate_argnums=0)


def batch_shardings(layout: layout_lib.Layout):
    """Batch fields are [batch, length] (or [batch]): split along the batch, as the layout says.
    (A PartitionSpec names leading dims only, so one sharding serves both ranks.)"""
    return NamedSharding(layout.mesh, P(*layout.spec(("batch",), strict=False)))
