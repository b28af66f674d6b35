"""The relative-position bias of a training step (relpos.toeplitz_bias): the forward is the
plain gather's, bit for bit, and the gradient (sums along the T + S - 1 diagonals, then a
one-hot matmul into the buckets) equals the gather's scatter-add at float32, with no scatter
over H.T.S left in a model's gradient."""
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from switchzoo import relpos, transformer, zoo
from switchzoo.relpos import diagonal_sums, gather_bias, offset_buckets, toeplitz_bias


def test_diagonal_sums_against_a_loop():
    g = np.random.default_rng(0).normal(size=(3, 4, 6))
    want = np.zeros((3, 9))
    for t in range(4):
        for s in range(6):
            want[:, s - t + 3] += g[:, t, s]
    np.testing.assert_allclose(diagonal_sums(jnp.asarray(g)), want, rtol=1e-6)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("T, S", [(7, 7), (5, 9), (64, 64)])
def test_the_bias_is_the_gathers_and_its_gradient_equal(bidirectional, T, S):
    table = jax.random.normal(jax.random.key(0), (32, 4))
    g = jax.random.normal(jax.random.key(1), (1, 4, T, S))
    buckets = offset_buckets(T, S, bidirectional, 32, 128)

    def gather(t):
        return gather_bias(t, jnp.arange(T)[None], jnp.arange(S)[None], bidirectional, 128)

    def toeplitz(t):
        return toeplitz_bias(t, T, S, buckets)

    assert np.array_equal(gather(table), toeplitz(table))          # bit for bit
    want, got = (jax.grad(lambda t, f=f: jnp.sum(f(t) * g))(table) for f in (gather, toeplitz))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(want))))
    assert "scatter" not in str(jax.make_jaxpr(jax.grad(lambda t: jnp.sum(toeplitz(t) * g)))(
        table))
    assert "scatter" in str(jax.make_jaxpr(jax.grad(lambda t: jnp.sum(gather(t) * g)))(table))


def scatters(jaxpr) -> list:
    """The scatter equations of a jaxpr, sub-jaxprs (scans, custom rules) included."""
    found = []
    for eqn in jaxpr.eqns:
        if "scatter" in eqn.primitive.name:
            found.append(eqn)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += scatters(sub)
    return found


@pytest.mark.parametrize("diagonal", [True, False])
def test_a_models_gradient_has_no_scatter_over_heads_queries_and_keys(monkeypatch, diagonal):
    """A Switch encoder-decoder on 32 tokens, the bias's gradient as a GPU or TPU takes it:
    the only scatters left are the embedding's (its rows), none updates a [.., T, S] block of
    a bias. The CPU's choice (the gather's scatter-add, faster on XLA:CPU) has one."""
    monkeypatch.setattr(relpos, "DIAGONAL_GRADIENT", diagonal)
    cfg = zoo.get("switch_base_tiny")
    graphdef, params = nnx.split(transformer.build(cfg.replace(dropout=0.0)))
    B, T = 2, 32
    ids = jnp.ones((B, T), jnp.int32)

    def loss(params):
        logits, _ = nnx.merge(graphdef, params)(ids, ids)
        return jnp.mean(logits)

    jaxpr = jax.make_jaxpr(jax.grad(loss))(params).jaxpr
    found = scatters(jaxpr)
    assert found                              # the embedding's: the reading itself works
    big = [e for e in found if list(e.invars[2].aval.shape).count(T) >= 2]
    assert not big if diagonal else big, [str(e)[:200] for e in big]
