"""The optimizers' own arithmetic (switchzoo.optim) against optax's: AdamW with its moments
stored in bfloat16."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from switchzoo import optim, validate
from switchzoo import state as state_lib
from switchzoo.configs import c4


def test_adamw_moments_in_bfloat16_follow_optax_adamw_and_are_refused_for_adafactor():
    """optim.scale_by_adam_in: at float32 it is optax's AdamW (to float32 rounding) over 20
    steps; with bfloat16 moments the parameters stay within 1e-3 of it and the state holds
    bfloat16. moments_dtype is AdamW's: with Adafactor it is refused in one line."""
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(48, 16)), jnp.float32),
              "b": jnp.asarray(rng.normal(size=(5,)), jnp.float32)}
    grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=(20,) + x.shape), jnp.float32),
                         params)                                   # 20 steps' gradients

    def run(dtype_name, params):
        dt = jnp.dtype(dtype_name)
        txs = [optax.adamw(1e-2, b1=0.9, b2=0.98, weight_decay=0.01),
               optax.chain(optim.scale_by_adam_in(dt, 0.9, 0.98), optax.add_decayed_weights(0.01),
                           optax.scale_by_learning_rate(1e-2))]
        out = []
        for tx in txs:
            def step(carry, g, tx=tx):
                p, s = carry
                u, s = tx.update(jax.tree.map(lambda g, p: g + 0.1 * p, g, p), s, p)
                return (optax.apply_updates(p, u), s), None
            out.append(jax.lax.scan(step, (params, tx.init(params)), grads)[0])
        return out
    run = jax.jit(run, static_argnums=0)
    for name, tol in (("float32", 1e-6), ("bfloat16", 1e-3)):
        (want, _), (got, state) = run(name, params)
        gap = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)))
        assert gap < tol, (name, gap)
        assert {x.dtype for x in jax.tree.leaves((state[0].mu, state[0].nu))} == {
            jnp.dtype(name)}
    tx = state_lib.make_optimizer("adamw", 0.01, 10, moments_dtype="bfloat16")
    assert jax.tree.leaves(tx.init(params))[1].dtype == jnp.bfloat16
    config = c4.get_config()
    config.model, config.moments_dtype = "dense_sc_cpu", "bfloat16"         # Adafactor
    with pytest.raises(ValueError, match=r"^--config.moments_dtype.*optimizer=adamw"):
        validate.check(config)
