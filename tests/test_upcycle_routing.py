"""Upcycling's routing (Komatsuzaki et al. 2022): gates that sum to one after capacity drops,
and the straight-through estimator's forward and gradient against hand-worked routing and
finite differences."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from switchzoo import routing


ROUTE = jax.jit(routing.route, static_argnums=(1, 2),
                static_argnames=("sum_to_one", "straight_through"))


def test_a_token_that_loses_a_pick_to_capacity_keeps_gates_summing_to_one():
    """Komatsuzaki et al. 2022 app. B.7 renormalise *after* routing: with capacity 1, token 1's
    first choice (expert 0) is taken by token 0's, and its second (expert 2) gets all its
    weight; normalize_top_k's gates, set before capacity, would leave it p_2 / (p_0 + p_2)."""
    logits_GNE = jnp.log(jnp.array([[[0.6, 0.3, 0.1], [0.5, 0.1, 0.4]]]))
    for sum_to_one, token_1 in ((True, 1.0), (False, 0.4 / 0.9)):
        r = ROUTE(logits_GNE, 2, 1, sum_to_one=sum_to_one)
        assert r.metrics["dropped_fraction"] == 0.25
        np.testing.assert_allclose(np.sum(r.combine_GNEC, axis=(2, 3)), [[1.0, token_1]],
                                   rtol=1e-6)
        np.testing.assert_allclose(np.sum(r.combine_GNEC[0, 1], -1), [0, 0, token_1], rtol=1e-6)


def hand_routing(logits_GNE, top_k, capacity):
    """The oracle's routing, in numpy: each token's top-k experts by probability, slots taken
    choice by choice, then position by position (GShard's priority); (expert, kept) per pick."""
    order = np.argsort(-np.asarray(logits_GNE), axis=-1)[..., :top_k]        # [G, N, P]
    G, N, E = logits_GNE.shape
    kept = np.zeros((G, N, top_k), bool)
    for g in range(G):
        used = np.zeros(E, int)
        for p in range(top_k):
            for n in range(N):
                e = order[g, n, p]
                kept[g, n, p] = used[e] < capacity
                used[e] += 1
    return order, kept


def gated_sum(logits_GNE, w_GNE, order, kept, renormalise):
    """The oracle's objective written by hand: sum over kept picks (hand_routing's) of gate x
    w[token, expert], the gate the softmax probability, renormalised over the token's kept
    picks if asked."""
    probs = jax.nn.softmax(logits_GNE, axis=-1)
    gates = jnp.take_along_axis(probs, jnp.asarray(order), -1) * kept
    if renormalise:
        gates = gates / jnp.maximum(jnp.sum(gates, -1, keepdims=True), 1e-30)
    return jnp.sum(gates * jnp.take_along_axis(w_GNE, jnp.asarray(order), -1))


def routed_sum(logits, w_GNE, top_k, capacity, straight_through):
    """switchzoo's: the renormalised combine weights x w."""
    r = routing.route(logits, top_k, capacity, sum_to_one=True, straight_through=straight_through)
    return jnp.sum(r.combine_GNEC * w_GNE[..., None])


ROUTED = jax.jit(jax.value_and_grad(routed_sum), static_argnums=(2, 3, 4))


@pytest.mark.parametrize("top_k", [1, 2])
def test_straight_through_forward_is_the_ungated_output_and_its_gradient_the_raw_gates(top_k):
    """Straight-through, by what it means: the forward value is the renormalised gates' (top-1:
    every kept token's expert output, un-gated, exactly), the router's gradient is that of a
    surrogate written here by hand in which each kept pick is weighted by its raw probability."""
    logits_GNE = jax.random.normal(jax.random.key(0), (2, 8, 4))
    w_GNE = jax.random.normal(jax.random.key(1), (2, 8, 4))
    capacity = 2 if top_k == 1 else 3
    order, kept = hand_routing(logits_GNE, top_k, capacity)
    assert 0 < kept.sum() < kept.size                                      # some picks dropped
    value, grad = ROUTED(logits_GNE, w_GNE, top_k, capacity, True)
    if top_k == 1:        # the un-gated expert output: each kept token's weight exactly 1
        r = ROUTE(logits_GNE, 1, capacity, sum_to_one=True, straight_through=True)
        np.testing.assert_array_equal(np.sum(r.combine_GNEC, axis=(2, 3)), kept[..., 0])
    np.testing.assert_allclose(value, gated_sum(logits_GNE, w_GNE, order, kept, True),
                               rtol=1e-6)
    want = jax.grad(gated_sum)(logits_GNE, w_GNE, order, kept, False)
    assert np.abs(want).max() > 0.01
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("top_k", [1, 2])
def test_without_straight_through_the_router_gets_the_true_gradient_of_the_gate_value(top_k):
    """The default (the paper's): the router's gradient is the gate value's own, checked by
    central finite differences of the routed objective (routing held fixed: steps too small to
    change any choice). Top-1's renormalised gate is the constant 1: no gradient at all."""
    logits_GNE = jax.random.normal(jax.random.key(2), (1, 8, 4))
    w_GNE = jax.random.normal(jax.random.key(3), (1, 8, 4))
    capacity = 2 if top_k == 1 else 3
    _, grad = ROUTED(logits_GNE, w_GNE, top_k, capacity, False)
    x = np.asarray(logits_GNE, np.float64)
    order, kept = hand_routing(x, top_k, capacity)

    def objective(z):                                  # float64, the routing of ``x``
        p = np.exp(z - z.max(-1, keepdims=True))
        p = np.take_along_axis(p / p.sum(-1, keepdims=True), order, -1) * kept
        p = p / np.where(p.sum(-1, keepdims=True) > 0, p.sum(-1, keepdims=True), 1.0)
        return float(np.sum(p * np.take_along_axis(np.asarray(w_GNE, np.float64), order, -1)))
    eps, fd = 1e-4, np.zeros_like(x)
    for index in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[index] += eps
        down[index] -= eps
        assert (hand_routing(up, top_k, capacity)[0] == order).all()
        fd[index] = (objective(up) - objective(down)) / (2 * eps)
    if top_k == 1:
        assert np.abs(fd).max() < 1e-6
    else:
        assert np.abs(fd).max() > 0.01
    np.testing.assert_allclose(grad, fd, atol=2e-5)
