"""Random parameters: ``param`` (a normal or truncated-normal weight with its logical dims,
drawn from the model's ``params`` key stream), and the same draws batched (``draw_all``): one
vmapped draw per (shape, dtype, kind) instead of one per parameter. The random bits are the
same; the program is smaller (XLA inlines a random-number generator per draw), so a set-up's
initialisation compiles faster (Setup.init: record the draws in the abstract build, make them
all at once, then build with them)."""
from __future__ import annotations

import contextlib
import threading
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from switchzoo import dims as dims_lib

# The std of a standard normal truncated to [-2, 2]: dividing by it keeps the asked-for std.
_TRUNCATED_STD = 0.87962566103423978


class Draw(NamedTuple):
    """One ``param`` call's draw, in the order the model's constructors make them."""
    shape: tuple
    dtype: object
    std: float
    truncated: bool


class _Plan(NamedTuple):
    record: list | None
    supply: object | None


_PLAN = threading.local()


def param(rngs: nnx.Rngs, std: float, shape, dims, dtype=jnp.float32,
          truncated: bool = False) -> nnx.Param:
    """A normal(0, std) parameter annotated with its logical dims; ``truncated``: drawn from a
    normal truncated at two standard deviations, rescaled so that its std is still ``std``.
    Inside ``drawing`` the draw is recorded, or taken from the draws made beforehand."""
    key = _next_key(rngs.params)
    plan = getattr(_PLAN, "current", None)
    if plan is not None and plan.record is not None:
        plan.record.append(Draw(tuple(shape), jnp.dtype(dtype), std, truncated))
    if plan is not None and plan.supply is not None:
        value = next(plan.supply)
        assert value.shape == tuple(shape) and value.dtype == dtype, (value.shape, shape)
    else:
        value = _scale(std, truncated) * _unit(key, tuple(shape), dtype, truncated)
    return nnx.Param(value, dims=dims_lib.check(tuple(dims), f"parameter {shape}"))


def _scale(std: float, truncated: bool) -> float:
    return std / _TRUNCATED_STD if truncated else std


def _unit(key, shape: tuple, dtype, truncated: bool) -> jax.Array:
    """The standard draw that ``param`` scales (std 1; truncated: before the rescaling)."""
    if truncated:
        return jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype)
    return jax.random.normal(key, shape, dtype)


def _next_key(stream) -> jax.Array:
    """``stream()`` (nnx's key for the stream's count, then count + 1), with the count written
    whole: nnx's own ``count[...] += 1`` builds, under a trace (abstract models: eval_shape),
    an error message it then discards, whose cost grows with the program traced so far, so a
    model's abstract set-up was quadratic in its parameters (switch_xxl: 8.3 s, 5.2 s of it
    this). The same keys, so the same weights."""
    key = jax.random.fold_in(stream.key[...], stream.count[...])
    stream.count.set_value(stream.count[...] + 1)
    return key


@contextlib.contextmanager
def drawing(record: list | None = None, supply=None):
    """While active, ``param`` appends its Draw to ``record`` and/or takes its value from the
    iterator ``supply`` instead of drawing it."""
    before = getattr(_PLAN, "current", None)
    _PLAN.current = _Plan(record, supply)
    try:
        yield
    finally:
        _PLAN.current = before


def draw_all(draws: list[Draw], seed: int) -> list[jax.Array]:
    """The values ``param`` draws for ``draws`` from ``nnx.Rngs(params=seed)`` (the i-th call
    takes key fold_in(stream key, i)), one vmapped draw per (shape, dtype, kind). With the
    tests' fast-compile flags a Switch model's initialisation fell from 3.2 to 1.5 s of CPU;
    at XLA's default flags the weights are bitwise the single draws'."""
    base = nnx.Rngs(params=seed).params.key[...]
    keys = jax.vmap(jax.random.fold_in, (None, 0))(base, jnp.arange(len(draws)))
    groups: dict[tuple, list[int]] = {}
    for i, d in enumerate(draws):
        groups.setdefault((d.shape, d.dtype, d.truncated), []).append(i)
    out: list = [None] * len(draws)
    for (shape, dtype, truncated), idx in groups.items():
        scale = jnp.asarray([_scale(draws[i].std, truncated) for i in idx], dtype)
        drawn = jax.vmap(lambda k, c: c * _unit(k, shape, dtype, truncated))(
            keys[jnp.asarray(idx)], scale)
        for j, i in enumerate(idx):
            out[i] = drawn[j]
    return out
