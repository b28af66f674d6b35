"""Experts' matmuls on rows grouped by expert, on one device: the block-sparse loop
(``block_matmul``, MegaBlocks-style, with its own gradient) and, for a few rows, a branch per
expert (``each_expert``). switchzoo/dropless.py sorts the rows and picks between them.

Shapes (switchzoo.dims): A rows (assignments), E experts, D and F the model and hidden
widths; the block loop's padded rows and blocks are named, not lettered.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from switchzoo.layers import mlp

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
