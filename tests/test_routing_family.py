"""The routing family of issue 16 against oracles: experts-choose routing (Zhou et al. 2022)
against a per-expert loop, DeepSeekMoE shared experts against a dense MLP, DeepSeek-V3's
auxiliary-loss-free balancing bias against its update rule."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from switchzoo import data, hf, steps, transformer
from switchzoo import layout as L
from switchzoo import state as state_lib
from switchzoo.config import ModelConfig, MoeConfig
from switchzoo.inspector import count_collectives
from switchzoo.moe import SwitchFFN
from switchzoo.routing import experts_choose_route, route
from tests.test_moe import run as call     # call(layer, ...): compiled, not op by op

D, F, E = 16, 32, 4


def make(router="experts_choose", shared=0, group_size=16, capacity_factor=1.0,
         eval_capacity_factor=None, **kw):
    # eval_groups="train": groups of group_size in evaluation mode too (the routing is the
    # subject here, not an example's independence from its batch)
    cfg = MoeConfig(num_experts=E, group_size=group_size, min_capacity=1, router=router,
                    num_shared_experts=shared, train_capacity_factor=capacity_factor,
                    eval_capacity_factor=eval_capacity_factor or capacity_factor,
                    eval_groups=kw.pop("eval_groups", "train"), **kw)
    return SwitchFFN(D, F, cfg, nnx.Rngs(0), encoder=True)


def run(ffn: SwitchFFN, x, valid=None):
    """The layer in evaluation mode, one compiled program: (y, stats, router gradient of
    sum(y^2))."""
    graphdef, params = nnx.split(ffn)

    def loss(params):
        y, stats = nnx.merge(graphdef, params)(x, valid_BL=valid)
        return jnp.sum(y.astype(jnp.float32) ** 2), (y, stats)
    grads, (y, stats) = jax.jit(jax.grad(loss, has_aux=True))(params)
    return y, stats, grads["router"]["w"][...]


def relu_mlp(x, wi, wo):
    return np.maximum(x @ wi, 0) @ wo


def oracle(ffn: SwitchFFN, x_BLD, C: int, valid_BL=None):
    """Expert by expert, group by group: the top-``C`` valid tokens by the expert's probability
    through its MLP, weighted by that probability; plus the shared experts' dense MLP. ``C``
    is worked out by the caller, not by the layer."""
    cfg = ffn.cfg
    x = np.asarray(x_BLD, np.float64)
    N = min(cfg.group_size, x.shape[0] * x.shape[1])
    wr, wi, wo = (np.asarray(p[...], np.float64) for p in (ffn.router.w, ffn.wi, ffn.wo))
    tokens = x.reshape(-1, N, x.shape[-1])
    valid = (np.ones(tokens.shape[:2], bool) if valid_BL is None
             else np.asarray(valid_BL).reshape(tokens.shape[:2]))
    y = np.zeros_like(tokens)
    for e in range(cfg.num_experts):
        for g, group in enumerate(tokens):
            logits = group @ wr
            probs = np.exp(logits - logits.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            ranked = [n for n in np.argsort(-probs[:, e], kind="stable") if valid[g, n]][:C]
            y[g, ranked] += probs[ranked, e, None] * relu_mlp(group[ranked], wi[e], wo[e])
    if cfg.num_shared_experts:
        y += relu_mlp(tokens, *(np.asarray(p[...], np.float64)
                                for p in (ffn.shared.wi, ffn.shared.wo)))
    return y.reshape(x.shape)


# ------------------------------------------------------------------------ experts-choose

def test_every_expert_takes_exactly_capacity_tokens_and_never_padding():
    logits = jax.random.normal(jax.random.key(0), (3, 16, E)) * 2
    valid = jnp.arange(16)[None] < jnp.array([16, 9, 5])[:, None]      # 5 < C: padding taken
    r = jax.jit(experts_choose_route, static_argnums=1)(logits, 6, valid)
    dispatch = np.asarray(r.dispatch_GNEC)
    np.testing.assert_array_equal(dispatch[:2].sum(1), 1.0)    # each (expert, slot): one token
    np.testing.assert_array_equal(dispatch[2].sum((0, 2)), 5.0)  # ... or none (padding masked)
    assert not dispatch[~np.asarray(valid)].any()
    probs = np.asarray(jax.nn.softmax(logits, -1))
    np.testing.assert_allclose(r.combine_GNEC, dispatch * probs[..., None], rtol=1e-6)
    np.testing.assert_allclose(r.metrics["expert_load"], 0.25, rtol=1e-6)
    routed = dispatch.sum((2, 3)) > 0
    np.testing.assert_allclose(float(r.metrics["dropped_fraction"]),
                               1 - routed[np.asarray(valid)].mean(), rtol=1e-6)
    assert float(r.aux_loss) == 0.0


@pytest.mark.parametrize("shape, shared, padded, eval_factor, capacity", [
    ((4, 8), 0, False, 1.0, 4),            # 16 tokens x 1.0 / 4 experts
    # evaluation keeps the training factor 1.0 (3.0 would give 12 slots)
    ((4, 8), 2, True, 3.0, 4),
    ((1, 1), 0, False, 1.0, 1),  # a cached decoding step: every expert takes the one token
])
def test_experts_choose_layer_equals_per_expert_loop(shape, shared, padded, eval_factor,
                                                     capacity):
    ffn = make(shared=shared, eval_capacity_factor=eval_factor)
    x = jax.random.normal(jax.random.key(1), shape + (D,))
    valid = None
    if padded:
        valid = jnp.ones(shape, bool).at[0, 5:].set(False)
    y, stats, router_grad = run(ffn, x, valid)
    np.testing.assert_allclose(y, oracle(ffn, x, capacity, valid), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stats["expert_load"], 0.25, rtol=1e-6)
    assert np.abs(router_grad).max() > 0          # through the gates (probabilities)


def test_sharded_experts_choose_with_shared_experts_matches_one_device():
    """dp_mp_ep: groups over data+expert, experts over expert, the shared MLP's d_ff over
    model; the same output as unsharded, tokens moved by all-to-all."""
    ffn = make(shared=1, group_size=8, capacity_factor=2.0)
    graphdef, params = nnx.split(ffn)
    lay = L.Layout.create("dp_mp_ep", "data:2,model:2,expert:2")
    x = jax.random.normal(jax.random.key(3), (8, 8, D))
    want = run(ffn, x)[0]

    @jax.jit
    def forward(params, x):
        with L.use(lay):
            return nnx.merge(graphdef, params)(x)[0]

    x = jax.device_put(x, lay.sharding(("batch", "length", "d_model"), x.shape, strict=False))
    compiled = forward.lower(params, x).compile()
    np.testing.assert_allclose(compiled(params, x), want, rtol=1e-5, atol=1e-6)
    assert count_collectives(compiled.as_text())["all-to-all"] > 0


def test_which_stacks_route_experts_choose_and_the_refusals():
    moe = MoeConfig(num_experts=E, router="experts_choose", top_k=2)
    base = ModelConfig(vocab_size=64, d_model=D, num_heads=2, d_kv=8, d_ff=F, num_layers=2,
                       num_encoder_layers=2, moe=moe)
    model = nnx.eval_shape(lambda: transformer.build(base))
    assert model.encoder.layers[1].ffn.experts_choose
    assert not model.decoder.layers[1].ffn.experts_choose     # causal: tokens-choose, top-2
    # One formula for both routers, top-2 included (Switch eq. 3): 64 x 1.25 / 4 = 20 slots.
    assert moe.capacity(64, True, experts_choose=False) == moe.capacity(64, True, True) == 20
    lm = base.replace(num_encoder_layers=0, moe=MoeConfig(
        num_experts=E, router="experts_choose", noncausal_decoder=True))
    assert nnx.eval_shape(lambda: transformer.build(lm)).decoder.layers[1].ffn.experts_choose
    with pytest.raises(ValueError, match=r"not causal.*--config.moe.noncausal_decoder=true"):
        base.replace(num_encoder_layers=0)
    with pytest.raises(ValueError, match=r"dispatch='dropless' with moe.router='experts_choose'"):
        MoeConfig(router="experts_choose", dispatch="dropless")
    # The capacity factor is part of an experts-choose stack's function: evaluation keeps it.
    assert moe.capacity(64, False, True) == 20
    assert moe.capacity(64, False, False) == 32          # tokens-choose: 64 x 2.0 / 4


def test_flags_that_would_add_parameters_to_a_checkpoints_model_are_refused():
    from switchzoo.configs import base
    config = base.get_base()
    config.task = "lm"
    checkpoint = tiny(MoeConfig(num_experts=E))
    for field, value in (("balance", "bias"), ("num_shared_experts", 1)):
        config.moe[field] = value
        with pytest.raises(ValueError, match=rf"--config.moe.{field}=.* changes which parameters"):
            state_lib.run_model_config(config, 64, checkpoint)
        config.moe[field] = None
    config.moe.router = "experts_choose"          # routing alone: the same parameters
    config.moe.noncausal_decoder = True
    assert state_lib.run_model_config(config, 64, checkpoint).moe.router == "experts_choose"


# ----------------------------------------------------------------------- shared experts

def tiny(moe: MoeConfig, num_layers=2, **kw) -> ModelConfig:
    return ModelConfig(vocab_size=64, d_model=D, num_heads=2, d_kv=8, d_ff=F,
                       num_layers=num_layers, moe=moe, **kw)


def test_shared_experts_shard_like_a_dense_ffn_and_hugging_face_refuses_them(tmp_path):
    s = state_lib.setup(tiny(MoeConfig(num_experts=E, num_shared_experts=2), num_encoder_layers=2),
                        "batch:data,d_ff:model,experts:expert", "data:2,model:2,expert:2")
    specs = {k: v.spec for k, v in jax.tree_util.tree_leaves_with_path(s.param_shardings)
             for k in [state_lib.path_name(k)]}
    assert s.abstract_params["decoder"]["layers"][1]["ffn"]["shared"]["wi"].shape == (D, 2 * F)
    assert specs["decoder/layers/1/ffn/shared/wi"] == P(None, "model")
    assert specs["decoder/layers/1/ffn/shared/wo"] == P("model")
    with pytest.raises(hf.CheckpointError, match=r"moe.num_shared_experts.*has no tensors"):
        hf.save(tmp_path / "hf", s.cfg, s.abstract_params)
    biased = state_lib.abstract_model(tiny(MoeConfig(num_experts=E, balance="bias"),
                                           num_encoder_layers=2))[1]
    with pytest.raises(hf.CheckpointError, match=r"moe.balance='bias'"):
        hf.sources(s.cfg, biased)
    chooser = tiny(MoeConfig(num_experts=E, router="experts_choose"), num_encoder_layers=2)
    with pytest.raises(hf.CheckpointError, match=r"routes tokens-choose only"):
        hf.save(tmp_path / "ec", chooser, state_lib.abstract_model(chooser)[1])
    assert not (tmp_path / "ec").exists()


def test_shared_experts_drop_at_the_dense_rate_not_the_expert_rate():
    """Shared experts are dense FFNs: they take ModelConfig.dropout (as Block passes it), the
    routed experts moe.expert_dropout."""
    def shared_only(expert_dropout, dense_dropout):
        cfg = MoeConfig(num_experts=E, group_size=16, min_capacity=1, num_shared_experts=1,
                        expert_dropout=expert_dropout)
        ffn = SwitchFFN(D, F, cfg, nnx.Rngs(0), dense_dropout=dense_dropout)
        ffn.wo.set_value(jnp.zeros_like(ffn.wo[...]))     # routed experts add 0: y = shared
        return ffn

    x = jax.random.normal(jax.random.key(9), (2, 8, D))
    want = relu_mlp(np.asarray(x, np.float64),
                    *(np.asarray(p[...], np.float64) for p in (shared_only(0, 0).shared.wi,
                                                                shared_only(0, 0).shared.wo)))
    key = jax.random.key(10)
    quiet = shared_only(expert_dropout=0.5, dense_dropout=0.0)
    np.testing.assert_allclose(call(quiet, x, rng=key)[0], want, rtol=1e-5, atol=1e-6)
    noisy = shared_only(expert_dropout=0.0, dense_dropout=0.5)
    np.testing.assert_allclose(call(noisy, x)[0], want, rtol=1e-5, atol=1e-6)   # evaluation
    assert not np.allclose(call(noisy, x, rng=key)[0], want, rtol=1e-3, atol=1e-3)
    model = nnx.eval_shape(lambda: transformer.build(tiny(
        MoeConfig(num_experts=E, num_shared_experts=1, expert_dropout=0.4), dropout=0.1)))
    assert model.decoder.layers[1].ffn.shared.rate == 0.1


# --------------------------------------------------------------- bias balancing (DS-V3)

def test_bias_shifts_the_choice_but_not_the_gates():
    logits = jax.random.normal(jax.random.key(4), (2, 16, E))
    bias = jnp.array([0.3, 0.0, -0.1, 0.0])
    pick = jax.jit(lambda bias: route(logits, 2, 32, bias_E=bias))
    plain, biased = pick(jnp.zeros(E)), pick(bias)
    chosen = np.asarray(biased.dispatch_GNEC).sum(-1)                       # [G, N, E]
    assert (chosen != np.asarray(plain.dispatch_GNEC).sum(-1)).any()        # choices moved
    probs = np.asarray(jax.nn.softmax(logits, -1))
    top2 = np.sort(np.where(chosen > 0, probs, 0), -1)[..., -2:].sum(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(biased.combine_GNEC).sum(-1),
                               chosen * probs / top2, rtol=1e-6)   # unbiased, renormalised


def test_balance_term_leaves_the_loss_and_gives_the_load_as_the_bias_gradient():
    cfg = tiny(MoeConfig(num_experts=E, balance="bias"))
    logits = jax.random.normal(jax.random.key(5), (2, 8, 64))
    batch = {"targets": jnp.ones((2, 8), jnp.int32), "weights": jnp.ones((2, 8))}
    load = jnp.array([[0.5, 0.25, 0.2, 0.05]])
    aux = {"aux_loss": jnp.float32(1.3), "z_loss": jnp.float32(2.0), "expert_load": load}

    def loss(bias):
        term = jnp.sum(bias * (load - 1 / E), -1)     # as routing.choose gives it
        return steps.lm_objective(logits, batch, {**aux, "bias_balance": term}, cfg)

    bias = jnp.array([[0.1, -0.2, 0.3, 0.0]])
    (with_term, metrics), grad = jax.jit(jax.value_and_grad(loss, has_aux=True))(bias)
    without, _ = jax.jit(steps.lm_objective, static_argnums=3)(logits, batch, aux, cfg)
    assert float(with_term) == float(without)
    np.testing.assert_allclose(grad, [[0.25, 0.0, -0.05, -0.2]], atol=1e-7)
    assert "bias_balance" not in metrics
    # balance='bias': the aux loss is reported, not trained on
    np.testing.assert_allclose(float(without), float(metrics["cross_entropy"]) + 0.001 * 2.0,
                               rtol=1e-6)


def test_bias_evens_out_a_skewed_router():
    """Router weights that make expert 0 win for most tokens; the bias update alone (the
    gradient of the balance term, stepped by SGD) moves the loads toward uniform."""
    ffn = make(router="tokens_choose", balance="bias", group_size=64)
    common = jax.random.normal(jax.random.key(6), (D,))
    x = jax.random.normal(jax.random.key(7), (4, 16, D)) + common
    w = jax.random.normal(jax.random.key(8), (D, E)) * 0.3
    ffn.router.w.set_value(w.at[:, 0].add(2 * common / jnp.sum(common ** 2)))
    graphdef, params = nnx.split(ffn)
    tx = state_lib.bias_update(0.05)

    @jax.jit
    def step(params):
        def balance(bias):
            with_bias = {**params, "router": {**params["router"], "bias": bias}}
            return jnp.sum(nnx.merge(graphdef, with_bias)(x)[1]["bias_balance"])
        bias = params["router"]["bias"]
        load = nnx.merge(graphdef, params)(x)[1]["expert_load"]
        update, _ = tx.update(jax.grad(balance)(bias), tx.init(bias))
        return load, optax.apply_updates(bias, update)

    params = nnx.to_pure_dict(params)
    loads = []
    for _ in range(10):
        load, new = step(params)
        np.testing.assert_allclose(new, params["router"]["bias"]
                                   + 0.05 * np.sign(0.25 - np.asarray(load)), atol=1e-7)
        params["router"]["bias"] = new
        loads.append(np.asarray(load).max())
    assert loads[0] >= 0.7 and max(loads[-3:]) < 0.4, loads        # uniform: 0.25


def test_train_step_moves_the_bias_by_the_rule_and_leaves_out_the_aux_loss():
    """The real step on a scanned one-layer LM: router/bias takes SGD at bias_rate, exactly
    bias + rate * sign(1/E - load) (the load of this step, before capacity)."""
    cfg = tiny(MoeConfig(num_experts=E, balance="bias", bias_rate=0.02, group_size=32,
                         sparse_every=1), scan_layers=True, num_layers=1)
    s = state_lib.setup(cfg, "data_parallel", L.make_mesh("data:1", jax.devices()[:1]),
                        optimizer=state_lib.make_optimizer("adamw", 1e-3, warmup_steps=1))
    train_step = steps.make_train_step(s)
    batch = next(data.byte_lm_batches(8, 16, seed=0))
    batch["inputs"], batch["targets"] = batch["inputs"] % 64, batch["targets"] % 64

    def bias_of(state):
        return np.asarray(state.params["decoder"]["scanned"][0]["ffn"]["router"]["bias"])

    state = s.init()
    before = bias_of(state)
    state, metrics = train_step(state, batch)
    load = np.asarray(metrics["expert_load"])                      # [1 sparse layer, E]
    np.testing.assert_allclose(bias_of(state), before + 0.02 * np.sign(0.25 - load), atol=1e-7)
    assert (bias_of(state) != 0).any()
    np.testing.assert_allclose(float(metrics["loss"]), float(metrics["cross_entropy"])
                               + 0.001 * float(metrics["z_loss"]), rtol=1e-6)


def test_flops_per_token_count_the_experts_an_experts_choose_token_visits():
    """An experts-choose encoder token visits capacity-factor experts on average; the decoder
    (tokens-choose) still visits top_k."""
    from switchzoo import zoo

    def flops(**kw):
        return zoo.flops_per_token(tiny(MoeConfig(num_experts=E, **kw), num_encoder_layers=2))
    experts = sum(math.prod(shape) for stack, dims, shape in zoo._param_shapes(
        tiny(MoeConfig(num_experts=E), num_encoder_layers=2))
        if stack == "encoder" and dims[0] == "experts")
    gained = flops(router="experts_choose", train_capacity_factor=2.0) - flops()
    assert experts > 0 and gained == pytest.approx(2 * experts * (2.0 - 1.0) / E)
