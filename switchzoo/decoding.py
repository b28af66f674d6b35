"""Generation with a KV cache, one jitted program per call shape: greedy, temperature / top-k
sampling and beam search, for encoder-decoders and decoder-only LMs.

Shapes: B batch, K beams, T generated length, V vocab. Token 0 is padding (and the decoder start
token of T5/Switch); finished sequences are padded with 0 after their EOS.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

NEG_INF = -1e9


def _prepare(model, src_BS, src_seg_BS, batch: int, max_new: int):
    """(first decoder tokens [B, L0], their segments, cache, start index, encoder segments)."""
    if hasattr(model, "encoder"):
        enc_BSD, _ = model.encode(src_BS, segments_BS=src_seg_BS)
        cache = model.init_cache(batch, max_new, enc_BSD)
        first = jnp.zeros((batch, 1), jnp.int32)
        return first, jnp.ones_like(first), cache, src_seg_BS
    cache = model.init_cache(batch, src_BS.shape[1] + max_new)
    return src_BS, src_seg_BS, cache, None


def _sample(logits_BV, rng, temperature: float, top_k: int, greedy: bool):
    if greedy:
        return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    logits_BV = logits_BV / temperature
    if top_k:
        kth = jax.lax.top_k(logits_BV, top_k)[0][:, -1:]
        logits_BV = jnp.where(logits_BV < kth, NEG_INF, logits_BV)
    return jax.random.categorical(rng, logits_BV).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new", "greedy", "temperature",
                                             "top_k", "eos_id"))
def sample(graphdef, params, src_BS, src_seg_BS, rng, *, max_new: int, greedy: bool = True,
           temperature: float = 1.0, top_k: int = 0, eos_id: int = 1):
    """Greedy or sampled continuation: new tokens [B, max_new] (0 after EOS)."""
    model = nnx.merge(graphdef, params)
    B = src_BS.shape[0]
    ids, seg, cache, enc_seg = _prepare(model, src_BS, src_seg_BS, B, max_new)
    logits, cache = model.decode(ids, cache, 0, seg, enc_seg)
    start = ids.shape[1]

    def step(carry, t):
        logits_BV, cache, done_B, rng = carry
        rng, sub = jax.random.split(rng)
        token_B = _sample(logits_BV, sub, temperature, top_k, greedy)
        token_B = jnp.where(done_B, 0, token_B)
        done_B = done_B | (token_B == eos_id)
        logits, cache = model.decode(token_B[:, None], cache, start + t, None, enc_seg)
        return (logits[:, -1], cache, done_B, rng), token_B

    carry = (logits[:, -1], cache, jnp.zeros((B,), bool), rng)
    _, tokens_TB = jax.lax.scan(step, carry, jnp.arange(max_new))
    return tokens_TB.T


def _gather(tree, index_BK, beams: int):
    """Reorders a [B*K, ...] tree by beam indices [B, K]."""
    def one(x):
        if x.ndim == 0:
            return x
        y = x.reshape((-1, beams) + x.shape[1:])
        return jnp.take_along_axis(y, index_BK.reshape(index_BK.shape + (1,) * (y.ndim - 2)),
                                   axis=1).reshape(x.shape)
    return jax.tree.map(one, tree)


def length_penalty(length, alpha: float):
    """GNMT's ((5 + length) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new", "beams", "alpha", "eos_id"))
def beam_search(graphdef, params, src_BS, src_seg_BS, *, max_new: int, beams: int = 4,
                alpha: float = 0.6, eos_id: int = 1):
    """Beam search with a length penalty; returns the best continuation [B, max_new] and its
    score (log-probability / length penalty). A beam ends at EOS; the search keeps the best
    ``beams`` finished and ``beams`` live hypotheses per example."""
    model = nnx.merge(graphdef, params)
    B, K = src_BS.shape[0], beams
    rep = lambda x: jnp.repeat(x, K, axis=0)                     # noqa: E731
    ids, seg, cache, enc_seg = _prepare(model, rep(src_BS), rep(src_seg_BS), B * K, max_new)
    logits, cache = model.decode(ids, cache, 0, seg, enc_seg)
    start = ids.shape[1]
    V = logits.shape[-1]
    # Only beam 0 is live at first, so the K copies do not fill the beam with duplicates.
    live_logp_BK = jnp.tile(jnp.array([0.0] + [NEG_INF] * (K - 1)), (B, 1))
    live_seq_BKT = jnp.zeros((B, K, max_new), jnp.int32)
    done_seq_BKT = jnp.zeros((B, K, max_new), jnp.int32)
    done_score_BK = jnp.full((B, K), NEG_INF)

    def step(carry, t):
        logits_NV, cache, live_logp_BK, live_seq_BKT, done_seq_BKT, done_score_BK = carry
        logp_BKV = jax.nn.log_softmax(logits_NV, -1).reshape(B, K, V) + live_logp_BK[..., None]
        top_logp, top_i = jax.lax.top_k(logp_BKV.reshape(B, K * V), 2 * K)
        beam_B2K, token_B2K = top_i // V, (top_i % V).astype(jnp.int32)
        seq_B2KT = jnp.take_along_axis(live_seq_BKT, beam_B2K[..., None], axis=1)
        seq_B2KT = seq_B2KT.at[:, :, t].set(token_B2K)
        ended = token_B2K == eos_id
        # Finished: merge the candidates that just emitted EOS into the finished set.
        score = jnp.where(ended, top_logp / length_penalty(t + 1.0, alpha), NEG_INF)
        all_score = jnp.concatenate([done_score_BK, score], 1)
        all_seq = jnp.concatenate([done_seq_BKT, seq_B2KT], 1)
        done_score_BK, keep = jax.lax.top_k(all_score, K)
        done_seq_BKT = jnp.take_along_axis(all_seq, keep[..., None], axis=1)
        # Live: the best K candidates that did not end.
        live_logp_BK, keep = jax.lax.top_k(jnp.where(ended, NEG_INF, top_logp), K)
        live_seq_BKT = jnp.take_along_axis(seq_B2KT, keep[..., None], axis=1)
        parent_BK = jnp.take_along_axis(beam_B2K, keep, axis=1)
        token_BK = jnp.take_along_axis(token_B2K, keep, axis=1)
        cache = _gather(cache, parent_BK, K)
        logits, cache = model.decode(token_BK.reshape(B * K, 1), cache, start + t, None, enc_seg)
        return (logits[:, -1], cache, live_logp_BK, live_seq_BKT, done_seq_BKT,
                done_score_BK), None

    carry = (logits[:, -1], cache, live_logp_BK, live_seq_BKT, done_seq_BKT, done_score_BK)
    carry, _ = jax.lax.scan(step, carry, jnp.arange(max_new))
    _, _, live_logp_BK, live_seq_BKT, done_seq_BKT, done_score_BK = carry
    # Examples with no finished hypothesis fall back to their best live one.
    live_score = live_logp_BK[:, 0] / length_penalty(float(max_new), alpha)
    use_live = done_score_BK[:, 0] <= NEG_INF / 2
    best = jnp.where(use_live[:, None], live_seq_BKT[:, 0], done_seq_BKT[:, 0])
    return best, jnp.where(use_live, live_score, done_score_BK[:, 0])
