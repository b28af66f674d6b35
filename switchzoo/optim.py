"""Optimizers and learning-rate schedules, as the Switch paper trains: T5's inverse-square-root
schedule, AdamW or Adafactor, the optimizer run per slice of a parameter's leading 'layers' and
'experts' dims (``per_layer``), router learning-rate scaling and DeepSeek-V3's balancing-bias
step. ``switchzoo.state`` builds them into a set-up (and re-exports them)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from switchzoo.paths import path_name


def rsqrt_schedule(learning_rate: float, warmup_steps: int):
    """The inverse-square-root schedule in T5's shape (Raffel et al. 2020; the Switch paper's):
    ``learning_rate`` x sqrt(k / max(step, k)), k = ``warmup_steps``: constant for the first k
    steps, then decaying as 1/sqrt(step). T5's own schedule is its constants, learning_rate 0.01
    and k 10^4: 1/sqrt(max(step, 10^4)) (configs/c4.py). A smaller k decays sooner: the CPU
    studies' k 250 is a third of the peak by step 2,400, where T5's is still at its peak."""
    k = max(warmup_steps, 1)

    def schedule(step):
        return learning_rate * jnp.sqrt(k / jnp.maximum(step, k).astype(jnp.float32))
    return schedule


def linear_rsqrt_schedule(learning_rate: float, warmup_steps: int):
    """A linear warm-up to ``learning_rate`` over ``warmup_steps``, then the rsqrt decay
    (the Transformer paper's shape, not T5's): learning_rate x min(step / k, sqrt(k / step))."""
    k = max(warmup_steps, 1)

    def schedule(step):
        step = jnp.maximum(step, 1).astype(jnp.float32)
        return learning_rate * jnp.minimum(step / k, jnp.sqrt(k / step))
    return schedule


def constant_schedule(learning_rate: float, warmup_steps: int):
    """``learning_rate`` at every step (T5X's fine-tuning: Adafactor at 1e-3, constant); the
    warm-up is not read."""
    del warmup_steps

    def schedule(step):
        return jnp.full((), learning_rate, jnp.float32)
    return schedule


SCHEDULES = {"rsqrt": rsqrt_schedule, "linear_rsqrt": linear_rsqrt_schedule,
             "constant": constant_schedule}


def make_schedule(name: str, learning_rate: float, warmup_steps: int):
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule '{name}'; use one of {', '.join(SCHEDULES)}")
    return SCHEDULES[name](learning_rate, warmup_steps)


def make_optimizer(name: str = "adamw", learning_rate: float = 1e-3, warmup_steps: int = 100,
                   weight_decay: float = 0.0, schedule: str = "rsqrt",
                   momentum: float = 0.0,
                   moments_dtype: str = "float32") -> optax.GradientTransformation:
    """AdamW or Adafactor (optax's defaults: factored, parameter-scaled, update clipping at 1;
    ``momentum`` > 0: its optional first moment of that decay, not debiased) under
    ``schedule`` (SCHEDULES). ``moments_dtype``: AdamW's two moments stored in this dtype
    (bfloat16: half their bytes; scale_by_adam_in)."""
    lr = make_schedule(schedule, learning_rate, warmup_steps)
    if name == "adamw":
        if momentum:
            raise ValueError("momentum is Adafactor's first moment; adamw keeps its own (b1 0.9)")
        if moments_dtype == "float32":
            return optax.adamw(lr, b1=0.9, b2=0.98, weight_decay=weight_decay)
        return optax.chain(scale_by_adam_in(jnp.dtype(moments_dtype), b1=0.9, b2=0.98),
                           optax.add_decayed_weights(weight_decay),
                           optax.scale_by_learning_rate(lr))
    if moments_dtype != "float32":
        raise ValueError(f"moments_dtype={moments_dtype} is AdamW's; Adafactor keeps its "
                         "factored statistics in float32")
    if name == "adafactor":
        return optax.adafactor(lr, momentum=momentum or None)
    raise ValueError(f"unknown optimizer '{name}'; use 'adamw' or 'adafactor'")


def scale_by_adam_in(dtype, b1: float = 0.9, b2: float = 0.999,
                     eps: float = 1e-8) -> optax.GradientTransformation:
    """Adam's scaling (optax.scale_by_adam's arithmetic, in float32) with both moments stored
    in ``dtype`` (optax's own ``mu_dtype`` covers the first moment alone), and the update
    computed from the moments as stored, so XLA keeps no copy of the old ones while it writes
    the new (bench/optimizer_bytes.py). Rounding each moment to bfloat16 keeps 8 bits of
    mantissa, which their running averages tolerate."""
    def init(params):
        zeros = lambda p: jnp.zeros(p.shape, dtype)           # noqa: E731
        return optax.ScaleByAdamState(count=jnp.zeros((), jnp.int32),
                                      mu=jax.tree.map(zeros, params),
                                      nu=jax.tree.map(zeros, params))

    def update(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        f32 = lambda x: x.astype(jnp.float32)                  # noqa: E731
        # The update reads the moments as stored (rounded), so the step needs no copy of the
        # old ones while it writes the new: one pass over each.
        mu = jax.tree.map(lambda g, m: ((1 - b1) * f32(g) + b1 * f32(m)).astype(dtype),
                          updates, state.mu)
        nu = jax.tree.map(lambda g, v: ((1 - b2) * jnp.square(f32(g)) + b2 * f32(v)
                                        ).astype(dtype), updates, state.nu)
        c1, c2 = 1 - b1 ** count, 1 - b2 ** count
        out = jax.tree.map(lambda g, m, v: ((f32(m) / c1) / (jnp.sqrt(f32(v) / c2) + eps)
                                            ).astype(g.dtype), updates, mu, nu)
        return out, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)
    return optax.GradientTransformation(init, update)


# Leading dims over which the optimizer runs slice by slice: each layer of a scanned stack, and
# each expert (T5X's MoE Adafactor rules: 'expert' is a batch dim, FactorDim.BATCH).
BATCH_DIMS = ("layers", "experts")


def batch_dims(dims: tuple[str, ...]) -> int:
    """How many leading dims of a parameter the optimizer treats as a batch of slices."""
    n = 0
    while n < len(dims) and dims[n] in BATCH_DIMS:
        n += 1
    return n


def per_layer(tx: optax.GradientTransformation, params, bias_rate: float = 0.0,
              dims: dict | None = None) -> optax.GradientTransformation:
    """``tx`` updating each slice of a parameter's leading 'layers' and 'experts' dims
    (``dims``: {path: logical dims}) on its own: every layer of a scanned stack exactly as the
    unrolled layer, and every expert as if it were a parameter of its own. Adafactor's
    factored second moments, parameter scale (RMS) and update clipping are taken over a whole
    array, which on a [layers, experts, ...] array would mix layers and experts (one expert's
    gradient spike would shrink every other expert's update). Other parameters as ``tx``.
    Without ``dims``, only stacks named 'scanned' are split (by layer).

    Routers' balancing biases (moe.balance='bias': ``.../router/bias``) step by ``bias_rate``
    x the sign of their gradient, load - 1/E of the whole batch (routing.choose): DeepSeek-V3's
    update, never rescaled or decayed by ``tx``."""
    def label(path, leaf):
        name = path_name(path)
        if name.endswith("router/bias"):
            return "router_bias"
        if dims is None:
            n = 1 if "scanned" in name.split("/") else 0
        else:
            n = batch_dims(dims[name])
        return "sliced_" + "x".join(map(str, leaf.shape[:n])) if n else "single"
    labels = jax.tree_util.tree_map_with_path(label, params)
    used = set(jax.tree.leaves(labels)) - {"single"}
    if not used:
        return tx
    transforms = {}
    for lab in used:
        if lab.startswith("sliced_"):
            sliced = tx           # one vmap per batch dim: a [layers, experts] slice grid
            for _ in lab[len("sliced_"):].split("x"):
                sliced = optax.GradientTransformation(jax.vmap(sliced.init),
                                                      jax.vmap(sliced.update))
            transforms[lab] = sliced
    if "router_bias" in used:
        transforms["router_bias"] = bias_update(bias_rate)
    return optax.multi_transform({"single": tx, **transforms}, labels)


def scale_routers(factor: float) -> optax.GradientTransformation:
    """Multiplies the updates of the routers' weights (``.../router/w``) by ``factor``: a router
    learning-rate multiplier. Adafactor's relative step moves a weight by about lr x its own
    RMS, and a router starts ~sqrt(0.1 / d_model) small (0.03 at d_model 128)."""
    def scale(updates, _):
        return jax.tree_util.tree_map_with_path(
            lambda p, u: u * factor if path_name(p).endswith("router/w") else u, updates)
    return optax.stateless(scale)


def freeze_routers(after: int) -> optax.GradientTransformation:
    """Zeroes the routers' updates (``.../router/w``, ``.../router/bias``) from step ``after`` on:
    the routers learn for ``after`` steps and then stay as they are, so a token's expert changes
    only as its hidden state does (StableMoE's second stage, Dai et al. 2022, with the model's
    own router frozen where StableMoE freezes a distilled one). Other updates pass as they are."""
    def init(params):
        del params
        return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

    def update(updates, state, params=None):
        del params
        live = state.count < after
        updates = jax.tree_util.tree_map_with_path(
            lambda p, u: jnp.where(live, u, jnp.zeros_like(u))
            if path_name(p).endswith(("router/w", "router/bias")) else u, updates)
        return updates, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))
    return optax.GradientTransformation(init, update)


def momentum_of_experts(decay: float, params, dims: dict) -> optax.GradientTransformation:
    """Adafactor's optional first moment on the experts' updates alone: each update of a
    parameter with an 'experts' batch dim (``dims``: {path: logical dims}) replaced by the
    moving average m = decay x m + (1 - decay) x update, not debiased (optax's and T5X's
    Adafactor momentum). An expert sees about 1/E of the tokens a dense FFN sees, so its
    normalised update is noisier; the average keeps the steady part. Other updates pass as
    they are."""
    experts = jax.tree_util.tree_map_with_path(
        lambda p, _: "experts" in dims[path_name(p)][:batch_dims(dims[path_name(p)])], params)
    return optax.masked(optax.ema(decay, debias=False), experts)


def bias_update(rate: float) -> optax.GradientTransformation:
    """DeepSeek-V3's balancing-bias step: bias -= rate * sign(gradient), the gradient being
    load - 1/E (routing.choose), so each step moves a bias by exactly ``rate``."""
    sign = optax.stateless(lambda g, _: jax.tree.map(jnp.sign, g))
    return optax.chain(sign, optax.sgd(rate))


def moment(opt_state, name: str = "mu") -> dict:
    """{parameter path: its ``name`` statistic} gathered from an optimizer state of any nesting
    (per_layer's multi_transform splits it by label; sliced labels keep full-shape leaves), e.g.
    Adam's first moment of every parameter."""
    out = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(opt_state):
        keys = [getattr(k, "name", getattr(k, "key", getattr(k, "idx", None))) for k in path]
        if name in keys:
            out[path_name(keys[keys.index(name) + 1:])] = leaf
    return out
