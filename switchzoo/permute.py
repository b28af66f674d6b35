"""Gathers whose gradient is a gather: the Switch dispatches move rows by maps whose inverse
they know (tokens into expert slots, slots back into tokens' picks, assignments into expert
order and padded blocks), so the transpose of each gather is a gather through the inverse map,
where autodiff's would be a float scatter-add whose indices XLA cannot know are unique
(atomics on a GPU). MaxText's sorted dispatch does the same with a sort and its inverse.

``gather(x_QD, index, inverse)``: x[index] (zeros where an index is past the end);
``inverse`` [Q] or [Q, P] gives, for each row of x, the flat position(s) in ``index`` that read
it (past the end where none), so the gradient of row q is the sum of those positions'."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def _take(table, index):
    """table[index] along the first dim, zeros where the index is past its end."""
    return table.at[index].get(mode="fill", fill_value=0)


@jax.custom_vjp
def gather(x_QD, index, inverse):
    """x_QD[index]: [*index.shape, D]."""
    return _take(x_QD, index)


def _gather_fwd(x_QD, index, inverse):
    return _take(x_QD, index), (inverse, index.ndim)


def _gather_bwd(res, g):
    inverse, ndim = res
    g = g.reshape((-1,) + g.shape[ndim:])           # the index's positions, flat
    dx = _take(g, inverse)
    return (jnp.sum(dx, axis=1) if inverse.ndim == 2 else dx), None, None


gather.defvjp(_gather_fwd, _gather_bwd)


def inverse_of(index, rows: int):
    """The inverse of an injective map ``index`` (positions -> rows of a table of ``rows``;
    indices past the end read nothing): each row's position, len(index) where none reads it.
    An integer scatter of distinct indices (no gradient, no collisions)."""
    n = index.shape[0]
    return jnp.full((rows,), n, jnp.int32).at[index].set(jnp.arange(n, dtype=jnp.int32),
                                                         mode="drop")


def dispatch(x_GND, token_GEC, cell_GNP):
    """Every group's slots [E, G, C, D] (expert-major, as the experts take them): each slot's
    token (``token_GEC``, N: empty), whose gradient sums each token's picks' slots
    (``cell_GNP``: each pick's slot e * C + c, E * C: none)."""
    G, E, C = token_GEC.shape
    x_GQD = jax.vmap(gather)(x_GND, token_GEC.reshape(G, E * C), cell_GNP)
    return jnp.swapaxes(x_GQD.reshape(G, E, C, -1), 0, 1)


def combine(y_EGCD, cell_GNP, pick_GEC):
    """Each token's picks' slot outputs [G, N, P, D] from the experts' [E, G, C, D]; a slot's
    gradient is its pick's (``pick_GEC``: n * P + p, N * P: empty)."""
    E, G, C, D = y_EGCD.shape
    y_GQD = jnp.swapaxes(y_EGCD, 0, 1).reshape(G, E * C, D)
    return jax.vmap(gather)(y_GQD, cell_GNP, pick_GEC.reshape(G, E * C))
