"""The train step's cross-entropy without the vocabulary blow-up: the output layer's logits are
made a chunk of positions at a time and never held whole, and the gradient is made in the same
pass (the "fused linear cross-entropy" of Liger-Kernel, here a custom VJP around a lax.scan).

Full logits cost a float32 [B, L, V] array plus its gradient on every step (Switch-Base at
32 x 512 tokens, vocab 32,128: 2 GiB each). Here the forward pass runs a lax.scan over chunks of
the length dim (the batch dim keeps its sharding; vocab may be sharded over a 'model' axis) and
per chunk makes the logits in float32 (the matmul accumulates in float32 from bfloat16
activations), the logsumexp, the label's logit (and label smoothing's mean logit), whether the
argmax is the label, and d cross-entropy / d logits = softmax - smoothed one-hot; from that the
chunk's dx = d_logits @ W and its share of dW = d_logits^T x. Those two (dx [B, L, D] and
dW [V, D]) are the residuals; the backward pass only scales them by the incoming cotangent. So
the vocabulary matmul runs 3 times per token, as with full logits (forward, dx, dW), not 4 as a
rematerialised chunk loop would (forward, then forward again + dx + dW).

The oracle is switchzoo.steps.lm_objective on full logits (loss_chunk=0; tests/test_loss.py)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from switchzoo import layout as layout_lib
from switchzoo.layout import constrain


def chunking(batch: int, length: int, tokens: int) -> tuple[int, int]:
    """(chunks, positions per chunk) for about ``tokens`` tokens per chunk, each chunk ``batch``
    rows (a device's share of the batch) over a run of positions. One chunk where the rows hold
    no more than ``tokens``. Else the largest divisor of ``length`` that fits, unless it is under
    half of what fits (a length with few divisors, e.g. a prime): then as many even chunks as
    fit, the length padded up to their multiple (under one position per chunk; weight 0)."""
    if tokens < 1:
        raise ValueError(f"loss_chunk={tokens} must be >= 1 tokens per chunk here (0 means the "
                         "full-logits loss, which does not chunk)")
    fits = max(tokens // batch, 1)
    if fits >= length:
        return 1, length
    divisor = max(d for d in range(1, fits + 1) if length % d == 0)
    if 2 * divisor > fits:
        return length // divisor, divisor
    chunks = -(-length // fits)
    return chunks, -(-length // chunks)


def cross_entropy(x_BLD, w_VD, targets_BL, weights_BL, label_smoothing: float = 0.0,
                  chunk_tokens: int = 8192):
    """(sum of weights x cross-entropy, sum of weights x correct) over the tokens, both float32
    scalars, of the logits x_BLD @ w_VD^T, made about ``chunk_tokens`` tokens at a time on each
    device (chunking of the device's rows: the active layout's batch shards), so that the
    memory and the matmul size of a chunk do not shrink as the batch is split further.

    x_BLD: the output layer's input (any float dtype; the matmuls accumulate in float32);
    w_VD: its weight (the parameter's dtype; cast to x's for the matmuls, its gradient summed in
    float32); targets_BL: label ids; weights_BL: token weights (0: padding). The cross-entropy is
    lse - (1 - s) label - s mean(logits) (label smoothing s, as steps.lm_objective) and correct
    is steps.correct's rule (argmax = label, the first maximum). Differentiable in x and w (the
    count of correct tokens has gradient 0)."""
    B, L, _ = x_BLD.shape
    chunks, per_chunk = chunking(B // _batch_shards(B), L, chunk_tokens)
    pad = chunks * per_chunk - L
    weights_BL = weights_BL.astype(jnp.float32)
    if pad:
        x_BLD, targets_BL, weights_BL = (
            jnp.pad(a, ((0, 0), (0, pad)) + ((0, 0),) * (a.ndim - 2))
            for a in (x_BLD, targets_BL, weights_BL))

    def split(a):       # [B, L, ...] -> [chunks, B, per_chunk, ...], the batch dim kept whole
        return jnp.moveaxis(a.reshape((B, chunks, per_chunk) + a.shape[2:]), 1, 0)
    return _fused(split(x_BLD), w_VD, split(targets_BL), split(weights_BL),
                  float(label_smoothing))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _fused(x_JBLD, w_VD, targets_JBL, weights_JBL, smoothing):
    """cross_entropy's sums over chunks N of c positions (a pass without gradients, for a call
    outside jax.grad)."""
    ce, correct, _ = _chunk_pass(x_JBLD, w_VD, targets_JBL, weights_JBL, smoothing, False)
    return ce, correct


def _fused_fwd(x_JBLD, w_VD, targets_JBL, weights_JBL, smoothing):
    ce, correct, residuals = _chunk_pass(x_JBLD, w_VD, targets_JBL, weights_JBL, smoothing, True)
    return (ce, correct), residuals


def _fused_bwd(smoothing, residuals, cotangents):
    """The gradients were made in the forward pass for a cotangent of 1: scale them."""
    dx_JBLD, dw_VD = residuals
    g = cotangents[0]
    return ((g * dx_JBLD).astype(dx_JBLD.dtype), (g * dw_VD).astype(dw_VD.dtype), None, None)


_fused.defvjp(_fused_fwd, _fused_bwd)


def _batch_shards(batch: int) -> int:
    """How many shards the active layout splits the batch dim into (1 without a layout, or
    where they do not divide ``batch``)."""
    layout = layout_lib.active()
    parts = 1 if layout is None else layout.parts("batch")
    return parts if batch % parts == 0 else 1


def _chunk_pass(x_JBLD, w_VD, targets_JBL, weights_JBL, smoothing: float, grads: bool):
    """A lax.scan over the chunks: (ce sum, correct sum, (dx_JBLD, dw_VD) or None).

    The sums over the batch are carried per batch shard P (the layout's 'batch' axes): each
    device adds its rows' share to its own slice, and the slices are summed once after the
    loop. A carry summed over the batch inside the loop would all-reduce dW [V, D] over the
    data axis once per chunk."""
    V = w_VD.shape[0]
    P = _batch_shards(x_JBLD.shape[1])
    dtype = x_JBLD.dtype
    w_in_VD = w_VD.astype(dtype)

    def per_shard(a):   # [B, c, ...] -> [P, B / P x c, ...]: the tokens of one batch shard
        return a.reshape((P, -1) + a.shape[2:])

    def chunk(carry, xs):
        ce_B, correct_B, dw_BDV = carry
        x_BLD, t_BL, weight_BL = xs
        logits_BLV = constrain(jnp.einsum("BLD,VD->BLV", x_BLD, w_in_VD,
                                          preferred_element_type=jnp.float32),
                               ("batch", "length", "vocab"))
        max_BL = jnp.max(logits_BLV, axis=-1)
        lse_BL = max_BL + jnp.log(jnp.sum(jnp.exp(logits_BLV - max_BL[..., None]), axis=-1))
        vocab_V = jnp.arange(V)
        # A gather, not a masked sum: XLA:CPU writes a select's [B, c, V] out before reducing it
        label_BL = jnp.take_along_axis(logits_BLV, t_BL[..., None], axis=-1)[..., 0]
        ce_BL = lse_BL - label_BL
        if smoothing:
            ce_BL = lse_BL - (1 - smoothing) * label_BL - smoothing * jnp.mean(logits_BLV, -1)
        # Accuracy as steps.correct: the label's logit is the maximum (shared with the
        # logsumexp) and every logit before it is smaller. Its cost: one more masked max over
        # the chunk's logits, V compares per token (~1/D of the chunk's forward matmul), and no
        # [B, L, V] array.
        earlier_BL = jnp.max(jnp.where(vocab_V < t_BL[..., None], logits_BLV, -jnp.inf), -1)
        correct_BL = (label_BL >= max_BL) & (earlier_BL < label_BL)
        ce_B = ce_B + jnp.sum(per_shard(ce_BL * weight_BL), axis=1)
        correct_B = correct_B + jnp.sum(per_shard(correct_BL * weight_BL), axis=1)
        if not grads:
            return (ce_B, correct_B, dw_BDV), None
        # d (weight x ce) / d logits = weight x (softmax - smoothed one-hot), in the
        # activations' dtype for the two matmuls (as autodiff of the full logits would).
        p_BLV = jnp.exp(logits_BLV - lse_BL[..., None])
        hit_BLV = vocab_V == t_BL[..., None]
        d_BLV = ((p_BLV - (1 - smoothing) * hit_BLV - smoothing / V)
                 * weight_BL[..., None]).astype(dtype)
        dx_BLD = jnp.einsum("BLV,VD->BLD", d_BLV, w_in_VD,
                            preferred_element_type=jnp.float32).astype(dtype)
        # dW^T = x^T d_logits: d_logits is the matmul's right operand as it lies ([tokens, V],
        # contracted over tokens), where dW = d_logits^T x had XLA:CPU copy it transposed.
        dw_BDV = dw_BDV + jnp.einsum("BLD,BLV->BDV", per_shard(x_BLD), per_shard(d_BLV),
                                     preferred_element_type=jnp.float32)
        return (ce_B, correct_B, constrain(dw_BDV, ("batch", "d_model", "vocab"))), dx_BLD

    zero_B = constrain(jnp.zeros((P,), jnp.float32), ("batch",))
    dw_BDV = (constrain(jnp.zeros((P,) + w_VD.shape[::-1], jnp.float32),
                        ("batch", "d_model", "vocab")) if grads else None)
    (ce_B, correct_B, dw_BDV), dx_JBLD = jax.lax.scan(chunk, (zero_B, zero_B, dw_BDV),
                                                      (x_JBLD, targets_JBL, weights_JBL))
    if not grads:
        return jnp.sum(ce_B), jnp.sum(correct_B), None
    dw_VD = constrain(jnp.sum(dw_BDV, axis=0).T, ("vocab", "d_model")).astype(w_VD.dtype)
    return jnp.sum(ce_B), jnp.sum(correct_B), (dx_JBLD, dw_VD)
