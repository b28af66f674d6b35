"""T5's relative-position bias: the bucketing of key - query offsets, the learned [buckets,
heads] table, and the bias of a training step (every row's positions 0..T-1) whose gradient on
a GPU or TPU sums along diagonals instead of scattering H.T.S updates into the table."""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from switchzoo.draws import param


def relpos_bucket(rel_BTS, bidirectional: bool, num_buckets: int, max_distance: int):
    """T5's bucketing of key_pos - query_pos: exact for small offsets, log-spaced beyond."""
    n = -rel_BTS
    buckets = 0
    if bidirectional:
        num_buckets //= 2
        buckets = (n < 0).astype(jnp.int32) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    exact = num_buckets // 2
    is_small = n < exact
    log_ratio = jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / exact) / math.log(max_distance / exact)
    large = exact + (log_ratio * (num_buckets - exact)).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return buckets + jnp.where(is_small, n, large)


def diagonal_sums(g_HTS):
    """[H, T, S] -> [H, T + S - 1]: entry j sums g[:, t, s] over s - t = j - (T - 1). No
    scatter or gather, one pass over g: read as rows of S + 1, row t holds diagonal j at
    column j where t + j < S and diagonal j - S - 1 after it, so two masked sums over t give
    every diagonal (T <= S + 1, as self-attention's T = S; else a sheared copy)."""
    H, T, S = g_HTS.shape
    if T > S + 1:
        width = S + 2 * (T - 1)                 # T - 1 zeros each side of every row
        p = jnp.pad(g_HTS, ((0, 0), (0, 0), (T - 1, T - 1))).reshape(H, T * width)
        p = jnp.pad(p, ((0, 0), (0, T))).reshape(H, T, width + 1)   # row t starts t later
        return jnp.sum(p[:, :, :T + S - 1], axis=1)
    x = jnp.pad(g_HTS.reshape(H, T * S), ((0, 0), (0, T))).reshape(H, T, S + 1)
    upper = np.arange(T)[:, None] + np.arange(S + 1)[None, :] < S
    ahead = jnp.sum(jnp.where(upper, x, 0), axis=1)            # diagonals 0 .. S - 1
    behind = jnp.sum(jnp.where(upper, 0, x), axis=1)           # diagonals -S - 1 .. -1
    return jnp.concatenate([behind[:, S + 2 - T:], ahead[:, :S]], axis=1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def toeplitz_bias(table_RH, T: int, S: int, buckets):
    """The relative-position bias [1, H, T, S] of index positions 0..T-1 against 0..S-1:
    entry (t, s) is ``table_RH[buckets[s - t + T - 1]]``, ``buckets`` the bucket of each of
    the T + S - 1 offsets (a tuple). Its gradient sums the incoming [1, H, T, S] along the
    diagonals first (diagonal_sums: T + S - 1 offsets), then into the buckets with a
    [T + S - 1, N] one-hot matmul, where the plain gather's gradient scatter-adds all H.T.S
    entries into the table."""
    offsets_TS = np.arange(S)[None, :] - np.arange(T)[:, None] + T - 1
    rows = jnp.take(table_RH, jnp.asarray(buckets, jnp.int32), axis=0)   # [T + S - 1, H]
    return jnp.transpose(rows[offsets_TS], (2, 0, 1))[None]


def _toeplitz_fwd(table_RH, T, S, buckets):
    return toeplitz_bias(table_RH, T, S, buckets), table_RH.shape[0]


def _toeplitz_bwd(T, S, buckets, num_buckets, g_1HTS):
    sums = diagonal_sums(g_1HTS[0].astype(jnp.float32))          # [heads, T + S - 1 offsets]
    onehot = jax.nn.one_hot(np.asarray(buckets), num_buckets, dtype=jnp.float32)
    grad_RH = jnp.matmul(sums, onehot, precision=jax.lax.Precision.HIGHEST).T
    return (grad_RH.astype(g_1HTS.dtype),)


toeplitz_bias.defvjp(_toeplitz_fwd, _toeplitz_bwd)


def gather_bias(table_RH, q_pos_BT, k_pos_BS, bidirectional: bool, max_distance: int):
    """The bias [B, H, T, S] of queries at q_pos against keys at k_pos: each entry the table's
    row of its offset's bucket (a gather; its gradient a scatter-add into the table)."""
    bucket_BTS = relpos_bucket(k_pos_BS[:, None, :] - q_pos_BT[:, :, None], bidirectional,
                               table_RH.shape[0], max_distance)
    return jnp.transpose(jnp.take(table_RH, bucket_BTS, axis=0), (0, 3, 1, 2))


def offset_buckets(T: int, S: int, bidirectional: bool, num_buckets: int,
                   max_distance: int) -> tuple[int, ...]:
    """The bucket of each offset s - t from -(T - 1) to S - 1 (toeplitz_bias's ``buckets``),
    computed on the host even while a step traces."""
    with jax.ensure_compile_time_eval():
        buckets = relpos_bucket(np.arange(-(T - 1), S), bidirectional, num_buckets,
                                max_distance)
    return tuple(int(b) for b in np.asarray(buckets))


DIAGONAL_GRADIENT: bool | None = None    # None: on a GPU or TPU (RelativePositionBias.of_indices)


class RelativePositionBias(nnx.Module):
    """One learned scalar per (bucket, head), shared by all layers of a stack."""

    def __init__(self, num_buckets: int, max_distance: int, heads: int, bidirectional: bool,
                 rngs: nnx.Rngs):
        self.embedding = param(rngs, 1.0, (num_buckets, heads), ("relpos_buckets", "heads"))
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = bidirectional

    @jax.named_scope("relpos_bias")
    def __call__(self, q_pos_BT, k_pos_BS):
        return gather_bias(self.embedding[...], q_pos_BT, k_pos_BS, self.bidirectional,
                           self.max_distance)

    @jax.named_scope("relpos_bias")
    def of_indices(self, T: int, S: int):
        """The bias [1, H, T, S] of positions 0..T-1 against 0..S-1 (what every row of a packed
        batch sees within its segments). On a GPU or TPU its gradient is toeplitz_bias's
        diagonal sums, where the gather's scatter-add of H.T.S updates into a [buckets, H]
        table contends on atomics; XLA:CPU runs that scatter as a plain loop, faster than the
        sums there (bench/relpos_grad.py), so the CPU keeps it. DIAGONAL_GRADIENT decides."""
        diagonal = (jax.default_backend() in ("gpu", "tpu") if DIAGONAL_GRADIENT is None
                    else DIAGONAL_GRADIENT)
        if not diagonal:
            index = jnp.arange(T)[None], jnp.arange(S)[None]
            return self(*index)
        return toeplitz_bias(self.embedding[...], T, S, offset_buckets(
            T, S, self.bidirectional, self.num_buckets, self.max_distance))
