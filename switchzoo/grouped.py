"""Experts' matmuls on rows grouped by expert, on one device: the block-sparse loop
(``block_matmul``, MegaBlocks-style, with its own gradient) and, for a few rows, a branch per
expert (``each_expert``), which switchzoo/dropless.py sorts rows for and picks between; and
the capacity dispatch's experts on the kept picks only (``kept_experts``: one loop per expert,
each weight read once), which switchzoo/moe.py takes on a CPU.

Shapes (switchzoo.dims): A rows (assignments), E experts, D and F the model and hidden
widths; the block loop's padded rows and blocks are named, not lettered.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from switchzoo import permute
from switchzoo.layers import mlp

# kept_experts' rows per matmul block
KEPT_BLOCK = 16


def on_cpu_unless(flag: bool | None) -> bool:
    """A CPU-measured path's switch: ``flag`` where set (bench/cuda_hlo.py sets False to trace
    as a GPU), else whether JAX runs on a CPU."""
    return jax.default_backend() == "cpu" if flag is None else flag

def _dot(a, b, contract: tuple[int, int]):
    """A plain 2-D matmul contracting dim contract[0] of ``a`` with dim contract[1] of ``b``,
    accumulated in float32."""
    return jax.lax.dot_general(a, b, (((contract[0],), (contract[1],)), ((), ())),
                               preferred_element_type=jnp.float32)


def _block_loop(x, w, block_expert, num_blocks, block: int, transpose: bool):
    """out[rows of block j] = x[rows of block j] . w[block_expert[j]] (its transpose if asked),
    x [rows, in], w [experts, in, out], for the first num_blocks blocks (a loop with a traced
    trip count, so empty blocks cost nothing); zero elsewhere."""
    width = w.shape[1] if transpose else w.shape[2]

    def body(j, out):
        x_blk = jax.lax.dynamic_slice_in_dim(x, j * block, block, 0)
        w_j = jax.lax.dynamic_index_in_dim(w, block_expert[j], 0, keepdims=False)
        y = _dot(x_blk, w_j, (1, 1) if transpose else (1, 0))
        return jax.lax.dynamic_update_slice_in_dim(out, y.astype(out.dtype), j * block, 0)

    return jax.lax.fori_loop(0, num_blocks, body, jnp.zeros((x.shape[0], width), x.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def block_matmul(x, w_EDF, block_expert, num_blocks, block: int):
    """x [rows, D] x w [E, D, F] -> [rows, F], block j of ``block`` rows using expert
    block_expert[j]."""
    return _block_loop(x, w_EDF, block_expert, num_blocks, block, transpose=False)


def _block_matmul_fwd(x, w_EDF, block_expert, num_blocks, block):
    return block_matmul(x, w_EDF, block_expert, num_blocks, block), (x, w_EDF, block_expert,
                                                                     num_blocks)


def _block_matmul_bwd(block, res, g):
    x, w_EDF, block_expert, num_blocks = res
    dx = _block_loop(g, w_EDF, block_expert, num_blocks, block, transpose=True)

    def body(j, dw_EDF):
        x_blk = jax.lax.dynamic_slice_in_dim(x, j * block, block, 0)
        g_blk = jax.lax.dynamic_slice_in_dim(g, j * block, block, 0)
        e = block_expert[j]
        dw_DF = _dot(x_blk, g_blk, (0, 0))
        old = jax.lax.dynamic_index_in_dim(dw_EDF, e, 0, keepdims=True)
        return jax.lax.dynamic_update_index_in_dim(dw_EDF, old + dw_DF[None].astype(old.dtype),
                                                   e, 0)

    dw_EDF = jax.lax.fori_loop(0, num_blocks, body, jnp.zeros_like(w_EDF))
    return dx, dw_EDF, None, None


block_matmul.defvjp(_block_matmul_fwd, _block_matmul_bwd)


def each_expert(x_AD, expert_A, w: dict, dropout_fn=lambda h: h):
    """run_experts for a few assignments: each expert that has any runs its MLP over all A
    rows, each row keeping its own expert's; no sort, gather or loop. (experts hit) x A rows,
    never more than the block loop's one block of >= A rows per expert hit."""
    y_AD = jnp.zeros_like(x_AD)
    for e in range(w["wo"].shape[0]):
        mine_A = expert_A == e

        def run(y_AD, e=e, mine_A=mine_A):
            h_AD = mlp(x_AD, {k: v[e] for k, v in w.items()},
                       lambda x, v: _dot(x, v.astype(x.dtype), (1, 0)).astype(x.dtype),
                       dropout_fn=dropout_fn)
            return y_AD + jnp.where(mine_A[:, None], h_AD, 0)
        y_AD = jax.lax.cond(jnp.any(mine_A), run, lambda y_AD: y_AD, y_AD)
    return y_AD


# ------------------------------------------------------------------ experts on the kept picks

def _each_block(ids_E, n, start_E, count_E, block: int, body, init):
    """carry = body(carry, e, w row first, end, blocks) for each of the first ``n`` experts of
    ``ids_E`` (the non-empty ones, in increasing order): a loop over experts (traced count)."""
    def one(i, carry):
        e = ids_E[i]
        return body(carry, e, start_E[e], start_E[e] + count_E[e], -(-count_E[e] // block))
    return jax.lax.fori_loop(0, n, one, init)


def _sorted_matmul(x, w_EDF, ids_E, n, start_E, count_E, block):
    """Rows start_E[e] .. + count_E[e] of ``x`` (sorted by expert, ``block`` rows of slack at
    the end) times w[e], block by block; each expert's weight is read out once. A last block
    may run past its expert into the next one's rows, which that expert (later in the loop)
    writes again; rows past every expert's are zero."""
    def body(out, e, first, end, blocks):
        w_DF = jax.lax.dynamic_index_in_dim(w_EDF, e, 0, keepdims=False)

        def step(j, out):
            y = jax.lax.dynamic_slice_in_dim(x, first + j * block, block, 0) @ w_DF
            return jax.lax.dynamic_update_slice_in_dim(out, y, first + j * block, 0)
        return jax.lax.fori_loop(0, blocks, step, out)
    out = _each_block(ids_E, n, start_E, count_E, block, body,
                      jnp.zeros((x.shape[0], w_EDF.shape[2]), x.dtype))
    return jnp.where((jnp.arange(x.shape[0]) < jnp.sum(count_E))[:, None], out, 0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def sorted_matmul(x, w_EDF, ids_E, n, start_E, count_E, block: int):
    """x [rows, D] sorted by expert x w [E, D, F] -> [rows, F] (``_sorted_matmul``)."""
    return _sorted_matmul(x, w_EDF, ids_E, n, start_E, count_E, block)


def _sorted_matmul_fwd(x, w_EDF, ids_E, n, start_E, count_E, block):
    return (_sorted_matmul(x, w_EDF, ids_E, n, start_E, count_E, block),
            (x, w_EDF, ids_E, n, start_E, count_E))


def _sorted_matmul_bwd(block, res, g):
    x, w_EDF, ids_E, n, start_E, count_E = res

    def body(carry, e, first, end, blocks):
        dx, dw_EDF = carry
        w_DF = jax.lax.dynamic_index_in_dim(w_EDF, e, 0, keepdims=False)

        def step(j, carry):
            dx, dw_DF = carry
            row = first + j * block
            g_blk = jax.lax.dynamic_slice_in_dim(g, row, block, 0)
            g_blk = jnp.where((row + jnp.arange(block) < end)[:, None], g_blk, 0)  # e's rows
            x_blk = jax.lax.dynamic_slice_in_dim(x, row, block, 0)
            dx = jax.lax.dynamic_update_slice_in_dim(dx, g_blk @ w_DF.T, row, 0)
            return dx, dw_DF + jax.lax.dot_general(x_blk, g_blk, (((0,), (0,)), ((), ())))
        dx, dw_DF = jax.lax.fori_loop(0, blocks, step, (dx, jnp.zeros_like(w_DF)))
        return dx, jax.lax.dynamic_update_index_in_dim(dw_EDF, dw_DF, e, 0)
    dx, dw_EDF = _each_block(ids_E, n, start_E, count_E, block, body,
                             (jnp.zeros_like(x), jnp.zeros_like(w_EDF)))
    return dx, dw_EDF, None, None, None, None


sorted_matmul.defvjp(_sorted_matmul_fwd, _sorted_matmul_bwd)


def kept_experts(x_AD, expert_A, w: dict, block: int = KEPT_BLOCK):
    """Each assignment through its expert's MLP (layers.mlp), [A, D]: sorted by expert (ids
    >= E, the dropped picks, last and zero), ``sorted_matmul`` per weight, un-sorted; the work
    is the kept rows plus under ``block`` rows per expert, and no empty expert is read."""
    E, A = w["wo"].shape[0], x_AD.shape[0]
    order_A = jnp.argsort(expert_A, stable=True).astype(jnp.int32)
    sorted_A = permute.inverse_of(order_A, A)             # each assignment's sorted row
    count_E = jnp.bincount(expert_A, length=E + 1)[:E].astype(jnp.int32)
    start_E = (jnp.cumsum(count_E) - count_E).astype(jnp.int32)
    ids_E = jnp.argsort(count_E == 0, stable=True).astype(jnp.int32)   # non-empty first
    n = jnp.sum(count_E > 0)
    source_row = jnp.concatenate([order_A, jnp.full((block,), A, jnp.int32)])   # slack: zeros
    x_rows = permute.gather(x_AD, source_row, sorted_A)
    y_rows = mlp(x_rows, w, lambda x, w: sorted_matmul(x, w.astype(x.dtype), ids_E, n,
                                                       start_E, count_E, block))
    return permute.gather(y_rows, sorted_A, source_row)
