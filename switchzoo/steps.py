"""The jitted steps: the objective, the train step (gradients, accumulation, optimizer update)
and the eval step, each one jit with the state's shardings from switchzoo.state."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from switchzoo import layout as layout_lib
from switchzoo import loss as loss_lib
from switchzoo import state as state_lib
from switchzoo.config import ModelConfig


@jax.named_scope("loss")
def lm_objective(logits_BLV, batch, aux, cfg: ModelConfig, label_smoothing: float = 0.0,
                 tokens=None, share: float = 1.0):
    """Cross-entropy (with optional label smoothing) + weighted aux and z losses (the aux loss
    only reported under moe.balance='bias', whose bias steps come from a zero-valued term:
    routing.choose).

    A micro-batch of an accumulated step passes the whole batch's target ``tokens`` (its
    cross-entropy and accuracy are then its share of the whole batch's, token-weighted) and its
    ``share`` of the routing losses (1 / micro-batches), so the micro-batch terms sum to the
    whole batch's."""
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
    correct_BL = correct(logits_BLV, label_BL, targets_BL)
    return _objective(jnp.sum(ce_BL * weights_BL), jnp.sum(correct_BL * weights_BL),
                      weights_BL, aux, cfg, tokens, share)


@jax.named_scope("loss")
def chunked_lm_objective(x_BLD, w_VD, batch, aux, cfg: ModelConfig, label_smoothing: float,
                         tokens, share: float, chunk_tokens: int):
    """lm_objective from the output layer's input and weight (``model.head_inputs``), its
    logits made about ``chunk_tokens`` tokens (per device) at a time and never held whole
    (switchzoo.loss)."""
    weights_BL = batch["weights"].astype(jnp.float32)
    ce_sum, correct_sum = loss_lib.cross_entropy(x_BLD, w_VD, batch["targets"], weights_BL,
                                                 label_smoothing, chunk_tokens)
    return _objective(ce_sum, correct_sum, weights_BL, aux, cfg, tokens, share)


def _objective(ce_sum, correct_sum, weights_BL, aux, cfg: ModelConfig, tokens, share):
    """The loss and metrics from the token-weighted sums of cross-entropy and correct tokens."""
    own = jnp.sum(weights_BL)
    tokens = jnp.maximum(own if tokens is None else tokens, 1.0)
    ce = ce_sum / tokens
    loss = ce
    if cfg.moe is not None:
        aux = dict(aux)
        aux.pop("routed_tokens", None)         # the eval step's weights, not a training curve
        aux_weight = 0.0 if cfg.moe.balance == "bias" else cfg.moe.aux_loss_weight
        loss = loss + share * (aux_weight * aux["aux_loss"]
                               + cfg.moe.z_loss_weight * aux["z_loss"])
        if "bias_balance" in aux:                  # + 0, for its gradient (routing.choose)
            balance = share * jnp.sum(aux.pop("bias_balance"))
            loss = loss + (balance - jax.lax.stop_gradient(balance))
    accuracy = correct_sum / tokens
    return loss, {"loss": loss, "cross_entropy": ce, "accuracy": accuracy, "tokens": own, **aux}


def correct(logits_BLV, label_BL, targets_BL):
    """argmax(logits) == target (the first maximum, as argmax picks), without an argmax: the
    target's logit is the largest, and every logit before it is smaller. Two plain max
    reductions (the first shared with the logsumexp's), where XLA:CPU runs argmax's (value,
    index) reduction over the whole [B, L, V] logits serially (9 ms of a 1-thread peer-bench
    step)."""
    before_BLV = jnp.arange(logits_BLV.shape[-1]) < targets_BL[..., None]
    earlier_BL = jnp.max(jnp.where(before_BLV, logits_BLV, -jnp.inf), axis=-1)
    return (label_BL >= jnp.max(logits_BLV, axis=-1)) & (earlier_BL < label_BL)


def step_key(seed: int, step, micro=None):
    """The dropout / jitter key of a step (and of micro-batch ``micro`` of an accumulated one)."""
    key = jax.random.fold_in(jax.random.key(seed + 1), step)
    return key if micro is None else jax.random.fold_in(key, micro)


@jax.named_scope("distill_loss")
def distill_objective(logits_BLV, teacher_logits_BLV, batch, aux, cfg: ModelConfig,
                      weight: float, label_smoothing: float = 0.0, tokens=None,
                      share: float = 1.0):
    """Distillation (Switch Transformer sec. 4.2): (1 - weight) x lm_objective's cross-entropy
    with the labels + weight x ``distill_ce``, the soft cross-entropy -sum_v p_teacher(v) log
    q_student(v) per target token, token-weighted as the label term is; plus the routing losses
    as lm_objective adds them. Label smoothing applies to the label term only (the teacher's
    probabilities are soft already). ``tokens``, ``share``: as lm_objective's."""
    loss, metrics = lm_objective(logits_BLV, batch, aux, cfg, label_smoothing, tokens, share)
    weights_BL = batch["weights"].astype(jnp.float32)
    logits_BLV = logits_BLV.astype(jnp.float32)
    p_BLV = jax.nn.softmax(jax.lax.stop_gradient(teacher_logits_BLV).astype(jnp.float32), -1)
    # -sum_v p log_softmax(logits) = logsumexp(logits) - sum_v p logits, as p sums to 1.
    soft_BL = jax.nn.logsumexp(logits_BLV, axis=-1) - jnp.sum(p_BLV * logits_BLV, axis=-1)
    tokens = jnp.maximum(jnp.sum(weights_BL) if tokens is None else tokens, 1.0)
    distill_ce = jnp.sum(soft_BL * weights_BL) / tokens
    # lm_objective's loss is its cross-entropy plus the routing terms: trade a share of the
    # cross-entropy for the soft one (weight 0 leaves its loss exactly as it is).
    loss = loss + weight * (distill_ce - metrics["cross_entropy"])
    return loss, {**metrics, "loss": loss, "distill_ce": distill_ce}


def make_loss_fn(s: state_lib.Setup, label_smoothing: float = 0.0,
                 teacher: state_lib.Setup | None = None, distill_weight: float = 0.0,
                 loss_chunk: int = 0):
    """loss_fn(params, batch, rng, tokens=None, share=1.0, teacher_params=None) -> (loss,
    metrics) (see lm_objective for ``tokens`` and ``share``).

    ``loss_chunk`` > 0 (without a teacher): the cross-entropy from the final hidden states and
    the output weights, that many tokens at a time (chunked_lm_objective), never the float32
    [B, L, V] logits; 0: lm_objective on the full logits (the oracle).

    Decoder-only: ``inputs`` predict ``targets``. Encoder-decoder: ``inputs`` are the source and
    the decoder reads ``targets`` shifted right (T5: starting with the pad id 0).

    With a ``teacher`` (its Setup on the same layout), the objective is distill_objective with
    ``distill_weight``: the teacher runs on the same batch in evaluation mode (no dropout or
    jitter, its eval capacity factor) with ``teacher_params``, outside the gradient."""
    graphdef, cfg, layout = s.graphdef, s.cfg, s.layout

    def loss_fn(params, batch, rng, tokens=None, share=1.0, teacher_params=None):
        model = nnx.merge(graphdef, params)
        if teacher is None and loss_chunk:
            x_BLD, aux = forward(model, cfg, layout, batch, rng, hidden=True)
            with layout_lib.use(layout):
                return chunked_lm_objective(*model.head_inputs(x_BLD), batch, aux, cfg,
                                            label_smoothing, tokens, share, loss_chunk)
        logits, aux = forward(model, cfg, layout, batch, rng)
        if teacher is None:
            return lm_objective(logits, batch, aux, cfg, label_smoothing, tokens, share)
        with jax.named_scope("teacher"):
            teacher_logits, _ = forward(nnx.merge(teacher.graphdef, teacher_params),
                                        teacher.cfg, teacher.layout, batch)
        return distill_objective(logits, jax.lax.stop_gradient(teacher_logits), batch, aux,
                                 cfg, distill_weight, label_smoothing, tokens, share)
    return loss_fn


def forward(model, cfg: ModelConfig, layout: layout_lib.Layout, batch, rng=None,
            hidden: bool = False):
    """Logits (``hidden``: the final hidden states [B, L, D] instead) and Switch stats of a
    batch (``rng`` None: evaluation mode)."""
    with layout_lib.use(layout):
        if cfg.is_encoder_decoder:
            return model(batch["inputs"],
                         shift_right(batch["targets"], batch.get("targets_segments")),
                         src_positions=batch.get("inputs_positions"),
                         src_segments=batch.get("inputs_segments"),
                         tgt_positions=batch.get("targets_positions"),
                         tgt_segments=batch.get("targets_segments"),
                         src_lengths=batch.get("inputs_lengths"),
                         tgt_lengths=batch.get("targets_lengths"), rng=rng,
                         return_hidden=hidden)
        return model(batch["inputs"], positions_BL=batch.get("positions"),
                     segments_BL=batch.get("segments"), lengths_B=batch.get("lengths"), rng=rng,
                     return_hidden=hidden)


def make_eval_step(s: state_lib.Setup):
    """Jitted eval_step(params, batch) -> sums over the batch: nll, tokens, correct (argmax =
    target), words, and the Switch metrics at the evaluation capacity factor, each layer's
    times the tokens it routed (``routed_tokens``, also returned), so that evaluate_loss
    weighs batches by their tokens and a batch of padding adds nothing."""
    graphdef, cfg, layout = s.graphdef, s.cfg, s.layout

    def eval_step(params, batch):
        logits_BLV, aux = forward(nnx.merge(graphdef, params), cfg, layout, batch)
        weights_BL = batch["weights"].astype(jnp.float32)
        logp_BLV = jax.nn.log_softmax(logits_BLV, axis=-1)
        nll_BL = -jnp.take_along_axis(logp_BLV, batch["targets"][..., None], -1)[..., 0]
        logits_BLV = logits_BLV.astype(jnp.float32)
        label_BL = jnp.take_along_axis(logits_BLV, batch["targets"][..., None], -1)[..., 0]
        correct_BL = correct(logits_BLV, label_BL, batch["targets"])
        out = {"nll": jnp.sum(nll_BL * weights_BL), "tokens": jnp.sum(weights_BL),
               "correct": jnp.sum(correct_BL * weights_BL),
               "words": jnp.sum(batch.get("num_words", jnp.zeros((1,), jnp.int32)))}
        if "routed_tokens" in aux:
            routed_L = aux["routed_tokens"]                     # [Switch layers]
            out["routed_tokens"] = routed_L
            out["dropped_fraction"] = aux["dropped_fraction"] * routed_L
            out["expert_load"] = aux["expert_load"] * routed_L[:, None]
        return out
    return jax.jit(eval_step, in_shardings=(s.param_shardings, state_lib.batch_shardings(layout)))


def shift_right(targets_BT, segments_BT=None):
    """Decoder inputs: the targets one step later, starting with the pad id 0 (and, in packed
    rows, restarting at 0 where each example begins)."""
    shifted = jnp.pad(targets_BT, ((0, 0), (1, 0)))[:, :-1]
    if segments_BT is None:
        return shifted
    starts = segments_BT != jnp.pad(segments_BT, ((0, 0), (1, 0)))[:, :-1]
    return jnp.where(starts, 0, shifted)


def micro_batches(batch: dict, accumulate: int) -> dict:
    """[accumulate, batch / accumulate, ...] with micro-batch i = rows i, i + accumulate, ...:
    strided, so every micro-batch has rows on every device that holds the batch (a contiguous
    split would put each on a fraction of them) and splitting moves no data."""
    def split(x):
        if x.shape[0] % accumulate:
            raise ValueError(f"grad_accum_steps={accumulate} does not divide the batch of "
                             f"{x.shape[0]} rows; make per_device_batch_size x devices a "
                             "multiple of it")
        return jnp.swapaxes(x.reshape((x.shape[0] // accumulate, accumulate) + x.shape[1:]),
                            0, 1)
    return jax.tree.map(split, batch)


def make_train_step(s: state_lib.Setup, label_smoothing: float = 0.0, accumulate: int = 1,
                    teacher: state_lib.Setup | None = None, distill_weight: float = 0.0,
                    loss_chunk: int = 0):
    """The one jitted step: loss, gradients, optimizer update. The state is donated; batch
    fields are [batch, ...] arrays.

    With a ``teacher`` (distillation, see make_loss_fn) the step is
    train_step(state, batch, teacher_params): the teacher's parameters are an argument in
    their own shardings (never donated, never baked into the program as constants).

    With ``accumulate`` > 1 the batch runs as that many strided micro-batches (micro_batches),
    each with its own dropout / jitter key; their gradients add up to the whole batch's: the
    cross-entropy token-weighted over the whole batch, the routing losses averaged over the
    micro-batches (each a mean over its own routing groups).

    ``loss_chunk``: tokens per chunk (per device) of the chunked cross-entropy (make_loss_fn;
    the run field of that name), 0: the full-logits loss."""
    tx, layout, seed = s.tx, s.layout, s.seed
    loss_fn = make_loss_fn(s, label_smoothing, teacher, distill_weight, loss_chunk)

    def train_step(state: state_lib.TrainState, batch, teacher_params=None):
        grad_fn = functools.partial(jax.grad(loss_fn, has_aux=True),
                                    teacher_params=teacher_params)
        if accumulate == 1:
            grads, metrics = grad_fn(state.params, batch, step_key(seed, state.step))
        else:
            micro = micro_batches(batch, accumulate)
            tokens = jnp.sum(batch["weights"].astype(jnp.float32))

            def add(total, i):
                mb = jax.tree.map(lambda x: x[i], micro)
                g, m = grad_fn(state.params, mb, step_key(seed, state.step, i),
                               tokens, 1.0 / accumulate)
                return jax.tree.map(jnp.add, total, (g, m)), None
            zero = jax.eval_shape(lambda: grad_fn(state.params, jax.tree.map(
                lambda x: x[0], micro), step_key(seed, state.step, 0), tokens, 1.0))
            zero = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), zero)
            (grads, metrics), _ = jax.lax.scan(add, zero, jnp.arange(accumulate))
            # Summed over micro-batches: loss, cross_entropy, accuracy and tokens are the whole
            # batch's already; the routing metrics become their mean.
            summed = ("loss", "cross_entropy", "distill_ce", "accuracy", "tokens")
            metrics = {k: v if k in summed else v / accumulate for k, v in metrics.items()}
        with jax.named_scope("optimizer"):
            updates, opt_state = tx.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
        return state_lib.TrainState(state.step + 1, params, opt_state), metrics

    in_shardings = (s.shardings, state_lib.batch_shardings(layout))
    if teacher is not None:
        in_shardings += (teacher.param_shardings,)
    return jax.jit(train_step, in_shardings=in_shardings,
                   out_shardings=(s.shardings, layout.replicated()), donate_argnums=0,
                   compiler_options=compiler_options(layout))


def compiler_options(layout: layout_lib.Layout) -> dict:
    """XLA options of the train step. On CPU devices, copy insertion by region analysis:
    without it XLA:CPU copies every weight that the update writes in place (the donated
    buffer) but the backward pass also reads, about half of all parameters on every step."""
    if layout.mesh.devices.flat[0].platform == "cpu":
        return {"xla_cpu_copy_insertion_use_region_analysis": True}
    return {}


@jax.jit
def params_finite(params):
    """Whether every parameter is finite: one pass over all of them, so the trainer runs it
    only where it checks a step (log and checkpoint steps), not inside every train step."""
    with jax.named_scope("checks"):
        return jnp.all(jnp.stack([jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(params)]))
