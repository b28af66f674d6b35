"""The index dispatch (gather into capacity slots, gather or scatter-add back) against the einsum
one, its oracle: the same outputs, routing losses and metrics, and gradients (by the input, the
router and the experts), with drops and padding, on one device and under expert parallelism;
there it is still an all-to-all, and it costs a fraction of the einsum's flops."""
import dataclasses

import jax
import jax.numpy as jnp
from jax.extend.core import jaxprs_in_params
import numpy as np
import pytest
from flax import nnx

from switchzoo import layout as L
from switchzoo.config import MoeConfig
from switchzoo.inspector import count_collectives
from switchzoo.moe import SwitchFFN
from switchzoo.routing import Router

D, F, E = 16, 32, 4
B, LEN = 8, 16                       # 128 tokens: 8 groups of 16, on one device as on eight
STATS = ("aux_loss", "z_loss", "dropped_fraction", "expert_load", "router_confidence",
         "routed_tokens")


def pair(top_k=1, router="tokens_choose", capacity_factor=0.75, group_size=16,
         activation="relu", **kw):
    """The same weights twice: einsum and index dispatch (experts-choose: an encoder layer)."""
    einsum = MoeConfig(num_experts=E, top_k=top_k, group_size=group_size, min_capacity=1,
                       dispatch="einsum", router=router, train_capacity_factor=capacity_factor,
                       eval_capacity_factor=capacity_factor, **kw)
    index = dataclasses.replace(einsum, dispatch="index")
    encoder = router == "experts_choose"
    return (SwitchFFN(D, F, einsum, nnx.Rngs(0), activation, encoder),
            SwitchFFN(D, F, index, nnx.Rngs(0), activation, encoder))


def loss_and_grads(ffn, x, valid, rng, layout=None):
    """Outputs, stats, and the gradients by every parameter and by x, jitted (under
    ``layout``)."""
    graphdef, state = nnx.split(ffn)

    @jax.jit
    def f(state, x):
        with L.use(layout):
            y, stats = nnx.merge(graphdef, state)(x, rng=rng, valid_BL=valid)
        return jnp.sum(jnp.sin(3 * y)) + stats["aux_loss"] + stats["z_loss"], (y, stats)

    if layout is not None:
        x = jax.device_put(x, layout.sharding(("batch", "length", "d_model"), x.shape))
    (_, (y, stats)), grads = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(state, x)
    return jax.device_get((y, stats, grads))


def assert_same(got, want):
    (y, stats, grads), (y0, stats0, grads0) = got, want
    np.testing.assert_allclose(y, y0, rtol=1e-5, atol=1e-6)
    for k in STATS:
        np.testing.assert_allclose(stats[k], stats0[k], rtol=1e-6, atol=1e-7, err_msg=k)
    jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6),
                 grads, grads0)


CASES = {   # name: pair(...) keywords, and whether the call trains (jitter, expert dropout)
    "top1_train": (dict(top_k=1, jitter=0.1, expert_dropout=0.2), True),
    "top2_gelu": (dict(top_k=2, activation="gated-gelu"), False),
    "top2_sum_to_one_train": (dict(top_k=2, gates_sum_to_one=True, expert_dropout=0.2), True),
    "experts_choose_train": (dict(router="experts_choose", expert_dropout=0.2), True),
}
X = jax.random.normal(jax.random.key(1), (B, LEN, D))
VALID = jnp.ones((B, LEN), bool).at[1, 5:].set(False).at[6, :].set(False)   # padding


@pytest.fixture(scope="module")
def expert_parallel():
    return L.Layout.create("batch:data+expert,experts:expert", "data:2,model:1,expert:4")


# Every case under expert parallelism; on one device the two routers (tokens- and
# experts-choose), which the sharded cases then only re-lay out.
@pytest.mark.parametrize("case, sharded", [(c, True) for c in CASES]
                         + [("top1_train", False), ("experts_choose_train", False)],
                         ids=[f"dp_ep-{c}" for c in CASES]
                         + ["1device-top1_train", "1device-experts_choose_train"])
def test_equals_einsum_dispatch_with_drops_and_padding(case, sharded, expert_parallel):
    kw, train = CASES[case]
    einsum, index = pair(**kw)
    rng = jax.random.key(2) if train else None
    layout = expert_parallel if sharded else None
    want = loss_and_grads(einsum, X, VALID, rng, layout)
    got = loss_and_grads(index, X, VALID, rng, layout)
    assert float(want[1]["dropped_fraction"]) > 0.1, "the test needs drops"
    assert float(want[1]["routed_tokens"]) == VALID.sum()
    assert np.all(got[0][~np.asarray(VALID)] == 0.0)          # padding gets no expert
    assert_same(got, want)


def test_expert_parallel_index_dispatch_compiles_to_all_to_all(expert_parallel):
    """Like the einsum dispatch: the tokens move to their experts' devices and back, in the
    forward and the backward pass; the routing indices stay with the tokens."""
    def counts(ffn):
        graphdef, state = nnx.split(ffn)

        def loss(state, x):
            with L.use(expert_parallel):
                return jnp.sum(nnx.merge(graphdef, state)(x)[0])

        x = jax.device_put(X, expert_parallel.sharding(("batch", "length", "d_model"), X.shape))
        return count_collectives(jax.jit(jax.grad(loss)).lower(state, x).compile().as_text())

    for kw in (dict(top_k=2), dict(router="experts_choose")):
        einsum, index = pair(**kw)
        got = counts(index)
        assert got["all-to-all"] >= 3, got        # dispatch, combine, and combine's gradient
        assert got == counts(einsum), kw          # and nothing the einsum dispatch has not


def test_flops_are_a_fraction_of_the_einsum_dispatchs():
    """Groups of 512 at capacity factor 1.25: the one-hot einsums cost 2 N E C D flops each way
    a group, in the forward and again in the backward pass, where the experts' MLP costs
    4 E C D F; gathering costs none."""
    def flops(ffn):
        graphdef, state = nnx.split(ffn)

        def loss(state, x):
            return jnp.sum(nnx.merge(graphdef, state)(x, rng=jax.random.key(0))[0])

        compiled = jax.jit(jax.value_and_grad(loss)).lower(state, x).compile()
        analysis = compiled.cost_analysis()
        return float((analysis[0] if isinstance(analysis, (list, tuple)) else analysis)["flops"])

    x = jax.random.normal(jax.random.key(3), (4, 256, D))           # 2 groups of 512
    for kw in (dict(top_k=2), dict(router="experts_choose")):
        einsum, index = pair(capacity_factor=1.25, group_size=512, **kw)
        C = 160                                                        # 512 x 1.25 / 4
        dispatch = 2 * 2 * 512 * E * C * D                             # both ways, both groups
        got, want = flops(index), flops(einsum)
        assert want - got > 2 * dispatch, (kw, got, want)              # forward and backward
        assert got < want / 5, (kw, got, want)


def test_auto_is_the_index_dispatch_where_tokens_can_drop():
    einsum, index = pair()
    auto = SwitchFFN(D, F, dataclasses.replace(index.cfg, dispatch="auto"), nnx.Rngs(0))

    def hlo(ffn):
        graphdef, state = nnx.split(ffn)
        return jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)[0]).lower(state, X).as_text()

    assert hlo(auto) == hlo(index) != hlo(einsum)


def test_router_matmul_runs_at_highest_precision():
    """float32 routing at full precision whatever the backend's default (TF32 on GPU), so
    every backend routes the same tokens to the same experts."""
    router = Router(D, E, nnx.Rngs(0))
    jaxpr = jax.make_jaxpr(lambda x: router(x, 0.1, jax.random.key(0)))(X)

    def dots(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                yield eqn
            for sub in jaxprs_in_params(eqn.params):
                yield from dots(sub)

    found = list(dots(jaxpr.jaxpr))
    assert len(found) == 1
    assert found[0].params["precision"] == (jax.lax.Precision.HIGHEST,) * 2, found[0].params


@pytest.mark.parametrize("kept", [True, False], ids=["kept_picks", "slots"])
@pytest.mark.parametrize("case", ["top1_train_no_dropout", "top2_gelu", "top2_sum_to_one"])
def test_one_device_kept_picks_or_slots_equal_einsum_dispatch(case, kept, monkeypatch):
    """On one device without expert dropout the index dispatch runs the experts on the kept
    picks only (grouped.kept_experts) where that is fewer rows than the capacity slots, else on
    the slots: both branches give the einsum dispatch's outputs, stats and gradients."""
    from switchzoo import moe
    kw, train = {"top1_train_no_dropout": (dict(top_k=1, jitter=0.1), True),
                 "top2_gelu": (dict(top_k=2, activation="gated-gelu"), False),
                 "top2_sum_to_one": (dict(top_k=2, gates_sum_to_one=True), True)}[case]
    monkeypatch.setattr(moe, "KEPT_EXPERT_ROWS", -10 ** 6 if kept else 10 ** 6)
    einsum, index = pair(**kw)
    rng = jax.random.key(2) if train else None
    want = loss_and_grads(einsum, X, VALID, rng)
    got = loss_and_grads(index, X, VALID, rng)
    assert float(want[1]["dropped_fraction"]) > 0.1, "the test needs drops"
    assert np.all(got[0][~np.asarray(VALID)] == 0.0)
    assert_same(got, want)


@pytest.mark.parametrize("block", [1, 3, 16])
def test_sorted_matmul_and_its_gradients_equal_a_dense_reference(block):
    """Rows sorted by expert (some experts empty, dropped rows last) times their expert's
    weight, blocks running past an expert's rows included."""
    from switchzoo.grouped import kept_experts
    rng = np.random.default_rng(0)
    A, Dm, Fm, Em = 23, 8, 12, 5
    expert = jnp.asarray(rng.choice([0, 2, 2, 3, Em], A), jnp.int32)      # 1, 4 empty; 5: drop
    x = jnp.asarray(rng.normal(size=(A, Dm)), jnp.float32)
    w = {"wi": jnp.asarray(rng.normal(size=(Em, Dm, Fm)), jnp.float32),
         "wo": jnp.asarray(rng.normal(size=(Em, Fm, Dm)), jnp.float32)}

    def reference(x, w):
        e = jnp.minimum(expert, Em - 1)
        h = jax.nn.relu(jnp.einsum("ad,adf->af", x, w["wi"][e]))
        return jnp.where((expert < Em)[:, None], jnp.einsum("af,afd->ad", h, w["wo"][e]), 0)

    def loss(f):
        return lambda x, w: jnp.sum(jnp.sin(f(x, w)))
    got = jax.jit(jax.value_and_grad(loss(lambda x, w: kept_experts(x, expert, w, block)),
                                     argnums=(0, 1)))(x, w)
    want = jax.value_and_grad(loss(reference), argnums=(0, 1))(x, w)
    jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-5), got, want)
