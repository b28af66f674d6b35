"""The Switch layer against a plain per-token loop over experts (the oracle)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from switchzoo import layout as L
from switchzoo.config import MoeConfig
from switchzoo.inspector import count_collectives
from switchzoo import moe
from switchzoo.moe import SwitchFFN
from switchzoo.routing import Router
from switchzoo.routing import route as _route

D, F, E = 16, 32, 4


def make(top_k=1, capacity_factor=4.0, group_size=16, seed=0, **kw):
    # eval_groups="train": groups of group_size in evaluation mode too (the layer's routing
    # groups are the subject here, not an example's independence from its batch)
    cfg = MoeConfig(num_experts=E, top_k=top_k, group_size=group_size, min_capacity=1,
                    dispatch="einsum", eval_groups=kw.pop("eval_groups", "train"),
                    train_capacity_factor=capacity_factor, eval_capacity_factor=capacity_factor,
                    **kw)
    return SwitchFFN(D, F, cfg, nnx.Rngs(seed))


# The layer under test runs compiled, one program per call signature (as in a model), not op
# by op: eager execution compiles each of its ~100 operations on its own, per shape (~1,000
# compiles in this file). (Each call is a new trace: the module's weights are its arguments.)
@nnx.jit
def run(module, *args, **kwargs):
    return module(*args, **kwargs)


# routing.route as the layer runs it: inside jit, one program per call signature.
route = jax.jit(_route, static_argnames=("top_k", "capacity", "normalize", "sum_to_one",
                                         "straight_through"))


def oracle(ffn: SwitchFFN, x_BLD, capacity: int):
    """Token by token, in position order; every first choice before any second choice; each
    expert takes ``capacity`` picks per group (worked out by the caller, not by the layer)."""
    cfg = ffn.cfg
    x = np.asarray(x_BLD, np.float64)
    B, L_, _ = x.shape
    wr, wi, wo = (np.asarray(p[...], np.float64) for p in (ffn.router.w, ffn.wi, ffn.wo))
    n_total = B * L_
    N = min(cfg.group_size, n_total)
    tokens = x.reshape(-1, N, x.shape[-1])
    y = np.zeros_like(tokens)
    kept = np.zeros(tokens.shape[:2] + (cfg.top_k,), bool)
    for g, group in enumerate(tokens):
        logits = group @ wr
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        picks = np.argsort(-probs, axis=-1)[:, :cfg.top_k]
        gates = np.take_along_axis(probs, picks, -1)
        if cfg.top_k > 1:
            gates /= gates.sum(-1, keepdims=True)
        load = np.zeros(cfg.num_experts, int)
        for p in range(cfg.top_k):
            for n in range(N):
                e = picks[n, p]
                if load[e] < capacity:
                    load[e] += 1
                    kept[g, n, p] = True
                    y[g, n] += gates[n, p] * (np.maximum(group[n] @ wi[e], 0) @ wo[e])
    return y.reshape(x.shape), kept


@pytest.mark.parametrize("top_k", [1, 2])
def test_equals_per_token_loop_when_nothing_drops(top_k):
    ffn = make(top_k=top_k, capacity_factor=float(E))
    x = jax.random.normal(jax.random.key(1), (4, 8, D))
    y, stats = run(ffn, x)
    want, kept = oracle(ffn, x, capacity=16)           # 16 tokens x 4.0 / 4 experts
    assert kept.all()
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    assert float(stats["dropped_fraction"]) == 0.0


@pytest.mark.parametrize("top_k", [1, 2])
def test_low_capacity_drops_exactly_the_over_capacity_tokens(top_k):
    """Top-1 and top-2 get the same slots (Switch eq. 3, not k x): top-2 drops more."""
    ffn = make(top_k=top_k, capacity_factor=0.5)
    x = jax.random.normal(jax.random.key(2), (4, 8, D))
    y, stats = run(ffn, x)
    want, kept = oracle(ffn, x, capacity=2)            # 16 tokens x 0.5 / 4 experts
    assert 0 < (~kept).sum() < kept.size, "the test needs some drops and some kept"
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    dropped_tokens = ~kept.any(-1).reshape(4, 8)
    assert np.all(np.asarray(y)[dropped_tokens] == 0.0)
    np.testing.assert_allclose(float(stats["dropped_fraction"]), (~kept).mean(), rtol=1e-6)


@pytest.mark.parametrize("top_k", [1, 2])
def test_capacity_is_the_switch_formula_whatever_top_k(top_k):
    """Switch eq. 3, round(N x factor / E) slots (flaxformer rounds to nearest), numbers worked
    by hand."""
    cfg = MoeConfig(num_experts=8, top_k=top_k, train_capacity_factor=1.25,
                    eval_capacity_factor=2.0, min_capacity=4)
    assert cfg.capacity(1024, train=True) == 160         # 1024 x 1.25 / 8, not 2 x that
    assert cfg.capacity(1024, train=False) == 256        # 1024 x 2.0 / 8
    assert cfg.capacity(8, train=True) == 4              # 1.25 slots: the minimum
    assert cfg.capacity(8, train=True, experts_choose=True) == 4
    # experts-choose evaluates at the train factor: 1000 x 1.25 / 8 = 156.25 (2.0 gives 250)
    assert cfg.capacity(1000, train=False, experts_choose=True) == 156
    # 100 x 1.1 / 10 is 11.000000000000002 in floating point: 11 slots, not 12
    assert MoeConfig(num_experts=10, top_k=top_k, min_capacity=1,
                     train_capacity_factor=1.1).capacity(100, train=True) == 11
    # to nearest, not up: 100 x 1.0 / 3 = 33.3 -> 33 (not 34)
    assert MoeConfig(num_experts=3, top_k=top_k, min_capacity=1,
                     train_capacity_factor=1.0).capacity(100, train=True) == 33
    assert MoeConfig(num_experts=8, expert_capacity=7).capacity(1024, train=True) == 7


def test_sparse_layer_rules():
    assert MoeConfig(num_experts=8, sparse_every=2).is_sparse(1)
    assert not MoeConfig(num_experts=8, sparse_every=2).is_sparse(0)
    assert MoeConfig(num_experts=8, sparse_layers=(0, 3)).is_sparse(3)


def test_aux_and_z_losses_match_their_formulas():
    logits = jax.random.normal(jax.random.key(3), (2, 16, E)) * 2
    r = route(logits, top_k=1, capacity=16)
    logits = np.asarray(logits, np.float64)         # the oracle in numpy (no eager jnp)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    f = np.stack([np.bincount(p.argmax(-1), minlength=E) / 16 for p in probs])
    want_aux = E * np.mean(np.sum(f * probs.mean(1), -1))          # Switch eq. 4 (alpha = 1)
    np.testing.assert_allclose(float(r.aux_loss), want_aux, rtol=1e-6)
    lse = np.log(np.exp(logits).sum(-1))
    np.testing.assert_allclose(float(r.z_loss), np.mean(lse ** 2), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(r.metrics["expert_load"]), f.mean(0), rtol=1e-6)
    np.testing.assert_allclose(float(r.metrics["router_confidence"]), probs.max(-1).mean(),
                               rtol=1e-6)
    # Perfect balance with a uniform router gives exactly 1.
    uniform = route(np.eye(E, dtype=np.float32)[None] * 1e-3, top_k=1, capacity=4)
    np.testing.assert_allclose(float(uniform.aux_loss), 1.0, rtol=1e-3)


def test_jitter_and_expert_dropout_only_in_training():
    x = jax.random.normal(jax.random.key(4), (2, 8, D))
    plain = make()
    want = np.asarray(run(plain, x)[0])
    # Without jitter or dropout a training call computes what evaluation does.
    np.testing.assert_array_equal(run(plain, x, rng=jax.random.key(5))[0], want)
    for kw in (dict(jitter=0.1), dict(expert_dropout=0.5), dict(jitter=0.1, expert_dropout=0.5)):
        ffn = make(**kw)                                  # the same weights as ``plain``
        np.testing.assert_array_equal(run(ffn, x)[0], want)    # evaluation ignores both
        assert not np.allclose(run(ffn, x, rng=jax.random.key(5))[0], want), kw   # each on its own


def expert_outputs(ffn: SwitchFFN, x_BLD):
    """Every expert's ReLU MLP on every token: [B, L, E, D], float64."""
    x = np.asarray(x_BLD, np.float64)
    wi, wo = (np.asarray(p[...], np.float64) for p in (ffn.wi, ffn.wo))
    return np.einsum("blef,efd->bled", np.maximum(np.einsum("bld,edf->blef", x, wi), 0), wo)


def test_jitter_alone_changes_the_routing_not_the_experts():
    """Top-1 with room for every token: each token's output is its expert's MLP times its gate,
    in training as in evaluation; jitter moves gates and some choices."""
    ffn = make(jitter=0.2, capacity_factor=float(E))
    x = jax.random.normal(jax.random.key(4), (8, 16, D))
    outs = expert_outputs(ffn, x)
    logits = np.asarray(x, np.float64) @ np.asarray(ffn.router.w[...], np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)

    def expert_and_gate(y):
        """The expert whose output y is a multiple of, and the multiple (least squares)."""
        y = np.asarray(y, np.float64)[..., None, :]
        gate = np.sum(y * outs, -1) / np.sum(outs * outs, -1)
        misfit = np.linalg.norm(y - gate[..., None] * outs, axis=-1)
        e = misfit.argmin(-1)
        assert np.all(np.take_along_axis(misfit, e[..., None], -1) < 1e-5), "not one expert"
        return e, np.take_along_axis(gate, e[..., None], -1)[..., 0]

    e_eval, g_eval = expert_and_gate(run(ffn, x)[0])
    np.testing.assert_array_equal(e_eval, probs.argmax(-1))
    np.testing.assert_allclose(g_eval, probs.max(-1), rtol=1e-4)
    e_train, g_train = expert_and_gate(run(ffn, x, rng=jax.random.key(5))[0])
    assert 0 < np.sum(e_train != e_eval) < e_eval.size / 2, "jitter should move a few choices"
    same = e_train == e_eval
    assert np.abs(g_train[same] - g_eval[same]).max() > 1e-3          # and the gates
    assert np.all((g_train > 0) & (g_train <= 1))


def test_jitter_multiplies_the_router_input_by_uniform_noise_in_1_pm_j():
    """An identity router reads the noise back: logit d = x_d n_d, n_d in [1 - j, 1 + j];
    a last expert summing every input shows the noise is on the input, not the logits."""
    router = Router(E, E + 1, nnx.Rngs(0))
    router.w.set_value(jnp.concatenate([jnp.eye(E), jnp.ones((E, 1))], 1))
    x = jax.random.uniform(jax.random.key(11), (2, 500, E), minval=0.5, maxval=2.0)
    logits = np.asarray(router(x, 0.1, jax.random.key(12)), np.float64)
    noise = logits[..., :E] / np.asarray(x, np.float64)
    assert 0.9 - 1e-6 <= noise.min() < 0.901 and 1.099 < noise.max() <= 1.1 + 1e-6
    assert abs(noise.mean() - 1.0) < 0.005                   # uniform around 1, not skewed
    np.testing.assert_allclose(logits[..., E], logits[..., :E].sum(-1), rtol=1e-6)
    np.testing.assert_array_equal(router(x, 0.1, None)[..., :E], x)            # evaluation
    np.testing.assert_array_equal(router(x, 0.0, jax.random.key(12))[..., :E], x)


def test_router_runs_in_float32_for_bfloat16_activations():
    ffn = make()
    x = jax.random.normal(jax.random.key(7), (2, 8, D)).astype(jnp.bfloat16)
    assert run(ffn.router, x).dtype == jnp.float32
    y, stats = run(ffn, x)
    assert y.dtype == jnp.bfloat16 and stats["aux_loss"].dtype == jnp.float32


def test_groups_are_the_fewest_of_at_most_group_size_that_split_evenly():
    assert moe.num_groups(4, 8, 16) == 2 and moe.num_groups(3, 8, 16) == 2     # 24 -> 2 x 12
    assert moe.num_groups(256, 114, 8192) == 4          # span corruption: 29,184 -> 4 x 7,296
    assert moe.num_groups(2, 5, 64) == 1 and moe.num_groups(7, 5, 0) == 7
    assert moe.num_groups(1, 13, 4) == 13               # a prime count: one token per group
    # over a layout's 32 shards of the groups (the paper's 32 cores): a multiple of 32
    assert moe.num_groups(256, 114, 8192, shards=32) == 32          # 912 tokens per device
    assert moe.num_groups(256, 512, 8192, shards=32) == 32
    assert moe.num_groups(4, 8, 64, shards=8) == 8 and moe.num_groups(3, 5, 4, shards=2) == 5
    with pytest.raises(ValueError, match=r"229 tokens per batch split evenly only into groups "
                                         r"of 1 \(moe.group_size 64\)"):
        moe.num_groups(1, 229, 64)            # a prime count: capacity would mean nothing
    ffn = make(group_size=16)
    y, _ = run(ffn, jnp.ones((3, 8, D)))                # 24 tokens route as 2 groups of 12
    assert y.shape == (3, 8, D)


@pytest.mark.parametrize("preset, mesh, all_to_all", [
    ("expert_parallel", "expert:4,data:2", True),
    ("dp_ep", "data:2,expert:4", True),
    ("data_parallel", "data:8", False),
])
def test_expert_parallel_dispatch_compiles_to_all_to_all(preset, mesh, all_to_all):
    ffn = make(group_size=8)
    graphdef, state = nnx.split(ffn)
    lay = L.Layout.create(preset, mesh)
    x_sharding = lay.sharding(("batch", "length", "d_model"), (8, 8, D), strict=False)

    @jax.jit
    def forward(state, x):
        with L.use(lay):
            return nnx.merge(graphdef, state)(x)[0]

    x = jax.device_put(jnp.ones((8, 8, D)), x_sharding)
    counts = count_collectives(forward.lower(state, x).compile().as_text())
    assert (counts["all-to-all"] > 0) == all_to_all, counts


def test_top2_aux_loss_is_one_at_perfect_balance():
    # Token n prefers expert n % E first and (n + 1) % E second: first choices are balanced.
    logits = np.stack([np.roll(np.array([3.0, 2.0, 0.0, 0.0]), n % E) for n in range(8)])[None]
    probs = np.exp(logits[0]) / np.exp(logits[0]).sum(-1, keepdims=True)
    logits = logits.astype(np.float32)
    r = route(logits, top_k=2, capacity=8)
    np.testing.assert_allclose(float(r.aux_loss), E * np.sum(0.25 * probs.mean(0)), rtol=1e-6)
    np.testing.assert_allclose(float(r.aux_loss), 1.0, rtol=1e-6)


def test_padding_is_not_routed_and_takes_no_capacity():
    ffn = make(capacity_factor=0.5, group_size=16)
    x = jax.random.normal(jax.random.key(8), (2, 8, D))
    valid = jnp.array([[1] * 5 + [0] * 3, [1] * 8], bool)
    noisy = x.at[0, 5:].set(jax.random.normal(jax.random.key(9), (3, D)) * 10)
    y1, s1 = run(ffn, x, valid_BL=valid)
    y2, s2 = run(ffn, noisy, valid_BL=valid)
    np.testing.assert_allclose(y1[1], y2[1], rtol=1e-6)   # row 1 cannot see row 0's padding
    assert np.all(np.asarray(y1)[0, 5:] == 0)
    np.testing.assert_allclose(float(s1["aux_loss"]), float(s2["aux_loss"]), rtol=1e-6)
    np.testing.assert_allclose(float(np.sum(s1["expert_load"])), 1.0, rtol=1e-6)


def test_training_uses_the_train_capacity_factor():
    cfg = MoeConfig(num_experts=E, group_size=16, min_capacity=1, train_capacity_factor=0.25,
                    eval_capacity_factor=float(E))
    ffn = SwitchFFN(D, F, cfg, nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(10), (2, 8, D))
    assert float(run(ffn, x)[1]["dropped_fraction"]) == 0.0
    assert float(run(ffn, x, rng=jax.random.key(0))[1]["dropped_fraction"]) >= 0.5


@pytest.mark.parametrize("dispatch, router", [
    ("einsum", "tokens_choose"), ("dropless", "tokens_choose"), ("einsum", "experts_choose")])
def test_padding_counts_in_no_metric_and_a_batch_of_padding_in_none(dispatch, router):
    """Every routing metric is a mean over the valid tokens of the call, ``routed_tokens``
    their count (the weight for averaging calls): a group of padding leaves the metrics as the
    other groups' alone, and a batch of padding (an evaluation filler batch) reports no drop,
    no load and weight 0, rather than a drop fraction of 1."""
    cfg = MoeConfig(num_experts=E, top_k=1, group_size=8, min_capacity=1, dispatch=dispatch,
                    router=router, train_capacity_factor=0.5, eval_capacity_factor=0.5)
    ffn = SwitchFFN(D, F, cfg, nnx.Rngs(0), encoder=True)
    x = jax.random.normal(jax.random.key(12), (2, 8, D))
    keys = ("dropped_fraction", "expert_load", "router_confidence")
    _, alone = run(ffn, x[1:])                                # row 1 is its own group
    _, padded = run(ffn, x, valid_BL=jnp.ones((2, 8), bool).at[0].set(False))  # row 0 pads
    if dispatch == "einsum":
        assert float(alone["dropped_fraction"]) > 0, "the test needs drops"
    for k in keys:
        np.testing.assert_allclose(padded[k], alone[k], rtol=1e-6, err_msg=k)
    assert float(alone["routed_tokens"]) == float(padded["routed_tokens"]) == 8
    _, empty = run(ffn, x, valid_BL=jnp.zeros((2, 8), bool))
    for k in keys + ("routed_tokens",):
        np.testing.assert_array_equal(empty[k], 0.0, err_msg=k)
