"""The Switch paper's recipe, each convention against an oracle that does not call the code
under test: initialisation (sec. 2.4), T5's learning-rate schedule, Adafactor per expert (T5X's
MoE rules) and over several steps (the paper's algorithm in numpy), and how the routing losses
combine over layers."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from switchzoo import state as state_lib
from switchzoo import masks, transformer, zoo
from switchzoo.config import ModelConfig, MoeConfig
from switchzoo.configs import c4, c4_cpu

# Inputs per output of each weight matrix, from its name and shape alone (the oracle), and the
# query's extra 1/sqrt(d_kv) (T5 folds the attention scale into the query's init).
def fan_in(name: str, shape) -> tuple[int, float]:
    leaf = name.split("/")[-1]
    if leaf in ("wi", "wi_0", "wi_1", "wo"):
        return shape[-2], 1.0
    if leaf in ("q", "k", "v"):
        return shape[0], shape[2] ** -0.5 if leaf == "q" else 1.0
    if leaf == "o":
        return shape[0] * shape[1], 1.0
    if leaf in ("w", "lm_head"):          # router [D, E], untied output layer [D, V]
        return shape[0], 1.0
    raise KeyError(name)


def weights(cfg: ModelConfig) -> dict[str, np.ndarray]:
    model = transformer.build(cfg, seed=0)
    return {state_lib.path_name(p): np.asarray(v[...])
            for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


CPU_SWITCH = dataclasses.replace(zoo.get("switch_cpu_8"), tie_embeddings=False)


@pytest.mark.parametrize("scale,truncated", [(0.1, True), (1.0, False)])
def test_every_weight_matrix_starts_at_std_sqrt_scale_over_fan_in(scale, truncated):
    """Switch: std sqrt(0.1 / fan-in), truncated at 2 std; T5: sqrt(1 / fan-in), normal.
    Embeddings and relative-position biases keep std 1 in both."""
    cfg = CPU_SWITCH.replace(init_scale=scale,
                             init_distribution="truncated_normal" if truncated else "normal")
    seen = set()
    for name, w in weights(cfg).items():
        leaf = name.split("/")[-1]
        if leaf == "scale":                                  # RMSNorm: ones
            np.testing.assert_array_equal(w, 1.0)
            continue
        if leaf == "embedding":
            np.testing.assert_allclose(w.std(), 1.0, rtol=0.1, err_msg=name)
            continue
        n, extra = fan_in(name, w.shape)
        want = (scale / n) ** 0.5 * extra
        np.testing.assert_allclose(w.std(), want, rtol=0.08, err_msg=name)
        beyond = np.abs(w).max() / want
        if truncated:       # a normal cut at 2 underlying std is < 2.28 of its own std
            assert beyond <= 2.0 / 0.8796 + 1e-4, (name, beyond)
        else:               # an untruncated normal of >= 4k draws reaches past 2.3 std
            assert beyond > 2.3, (name, beyond)
        seen.add(leaf)
    assert seen == {"wi", "wo", "q", "k", "v", "o", "w", "lm_head"}


def test_catalogue_switch_models_use_the_papers_init_and_t5_models_theirs():
    for name in ("switch_cpu_8", "switch_base_128", "switch_c", "dense_tiny"):
        cfg = zoo.get(name)
        assert (cfg.init_scale, cfg.init_distribution) == (0.1, "truncated_normal"), name
    for name in ("t5_cpu", "t5_base", "mtf_lm1b_h8"):
        cfg = zoo.get(name)
        assert (cfg.init_scale, cfg.init_distribution) == (1.0, "normal"), name


def test_schedule_is_t5s_inverse_square_root():
    """T5: lr(step) = 1 / sqrt(max(step, k)); with k = 10^4 that is 0.01 flat, then decaying."""
    t5 = state_lib.make_schedule("rsqrt", 0.01, 10_000)
    for step, want in [(0, 0.01), (1, 0.01), (5_000, 0.01), (10_000, 0.01),
                       (40_000, 1 / 40_000 ** 0.5), (90_000, 1 / 300)]:
        np.testing.assert_allclose(float(t5(step)), want, rtol=1e-6, err_msg=step)
    linear = state_lib.make_schedule("linear_rsqrt", 0.01, 10_000)
    for step, want in [(1, 1e-6), (5_000, 0.005), (10_000, 0.01), (40_000, 0.005)]:
        np.testing.assert_allclose(float(linear(step)), want, rtol=1e-6, err_msg=step)


def adafactor_slice(tx, w, g):
    """The oracle: Adafactor's first update of one expert's slice, as its own parameter."""
    return np.asarray(jax.jit(lambda g, w: tx.update(g, tx.init(w), w)[0])(g, w))


@pytest.mark.parametrize("scan", [False, True])
def test_adafactor_updates_each_expert_as_its_own_parameter(scan):
    """Whatever the other experts' gradients, expert e's update is Adafactor on its slice alone
    (factored moments, parameter-scale RMS and update clipping per expert); on today's pooled
    RMS a 10x gradient spike in expert 0 changed expert 1's update."""
    cfg = ModelConfig(vocab_size=128, d_model=128, num_heads=1, d_kv=8, d_ff=256,
                      num_layers=2, scan_layers=scan,
                      moe=MoeConfig(num_experts=4, sparse_every=1), init_scale=0.1)
    tx = optax.adafactor(1e-2)
    s = state_lib.setup(cfg, "data_parallel", "data:1", devices=jax.devices()[:1],
                        optimizer=tx)
    params = s.init().params
    key = jax.random.key(0)
    grads = jax.tree.map(lambda p: jax.random.normal(jax.random.fold_in(key, p.size), p.shape),
                         params)
    stack = params["decoder"]["scanned" if scan else "layers"][0]["ffn"]["wi"]
    assert stack.shape == ((2, 4, 128, 256) if scan else (4, 128, 256))   # [layers, experts, ...]

    update = jax.jit(lambda g: s.tx.update(g, s.tx.init(params), params)[0])

    def expert_update(spike: float):
        g = jax.tree.map(lambda x: x, grads)
        layers = g["decoder"]["scanned" if scan else "layers"][0]["ffn"]
        layers["wi"] = layers["wi"].at[(slice(None),) * scan + (0,)].multiply(spike)
        updates = update(g)
        return np.asarray(updates["decoder"]["scanned" if scan else "layers"][0]["ffn"]["wi"]), g

    for spike in (1.0, 10.0):
        got, g = expert_update(spike)
        wi_g = g["decoder"]["scanned" if scan else "layers"][0]["ffn"]["wi"]
        for index in ([(0, 1), (1, 1), (1, 0)] if scan else [(1,), (0,)]):
            want = adafactor_slice(tx, stack[index], wi_g[index])
            np.testing.assert_allclose(got[index], want, rtol=1e-5, atol=1e-8,
                                       err_msg=f"spike {spike}, slice {index}")


# Shazeer & Stern (2018), "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost":
# eps1 (added to G^2), eps2 (the least parameter scale), d (update clipping), the decay exponent
# (beta2_t = 1 - t^-0.8); a matrix is factored when both dims are >= 128 (T5X's and optax's
# threshold: smaller ones keep the full second moment).
EPS1, EPS2, CLIP_D, DECAY, FACTOR_MIN = 1e-30, 1e-3, 1.0, 0.8, 128


def _rms(x):
    return np.sqrt(np.mean(np.square(x)))


def adafactor_paper(params, grads, lr, k, sliced):
    """The oracle, Adafactor written out from the paper in float64 numpy: Algorithm 4 (a matrix:
    row sums R and column sums C of G^2, V = R C / 1^T R) or 5 (anything else: V elementwise),
    no momentum, beta2_t = 1 - t^-0.8 (t = 1, 2, ...: beta2_1 = 0), the update U = G / sqrt(V)
    clipped to U / max(1, RMS(U) / d), and the relative step: X_t = X_{t-1} - alpha_t U with
    alpha_t = max(eps2, RMS(X_{t-1})) rho_t, rho_t the recipe's rate, T5's lr sqrt(k / max(step,
    k)) at the global step before the update (step = t - 1). Each slice of a ``sliced`` weight
    (its leading experts dim) is a parameter of its own. ``grads``: one {name: G} per step.
    Returns each step's {name: update} and {(t, name, slice): RMS(U) / d} (> 1: clipped)."""
    x = {n: np.asarray(v, np.float64) for n, v in params.items()}
    moments, steps, clip = {}, [], {}
    for t, grad in enumerate(grads, start=1):
        beta2, rho = 1.0 - t ** -DECAY, lr * np.sqrt(k / max(t - 1, k))
        update = {}
        for name, g in grad.items():
            g, u = np.asarray(g, np.float64), np.empty(g.shape)
            for i in range(g.shape[0]) if name in sliced else [...]:
                m = moments.setdefault((name, i), {"R": 0.0, "C": 0.0, "V": 0.0})
                g2 = g[i] ** 2 + EPS1
                if g[i].ndim == 2 and min(g[i].shape) >= FACTOR_MIN:
                    m["R"] = beta2 * m["R"] + (1 - beta2) * g2.sum(axis=1)
                    m["C"] = beta2 * m["C"] + (1 - beta2) * g2.sum(axis=0)
                    v = np.outer(m["R"], m["C"]) / m["R"].sum()
                else:
                    m["V"] = v = beta2 * m["V"] + (1 - beta2) * g2
                step = g[i] / np.sqrt(v)
                clip[t, name, i] = _rms(step) / CLIP_D
                step /= max(1.0, clip[t, name, i])
                u[i] = -max(EPS2, _rms(x[name][i])) * rho * step
            update[name] = u
        x = {n: x[n] + update[n] for n in x}
        steps.append(update)
    return steps, clip


def test_adafactor_over_five_steps_is_the_papers_algorithm_per_expert():
    """The paper's recipe (configs/c4.py: Adafactor at 0.01 on the rsqrt schedule) as switchzoo
    sets it up, five steps of every parameter against the oracle above: factored matrices (the
    embedding, a dense FFN, each expert's slice of [experts, d_model, d_ff]), elementwise
    moments (attention, norms, router), the decay of the second moments and of the rate, the
    parameter scale's floor eps2 (a router far below it), and update clipping, which a 10x
    gradient spike in expert 0 (and the embedding) at step 4 sets off there and nowhere else."""
    config = c4.get_config()
    assert (config.optimizer, config.learning_rate, config.schedule, config.weight_decay,
            config.router_learning_rate_scale) == ("adafactor", 0.01, "rsqrt", 0.0, 1.0)
    config.warmup_steps = 2           # k: the recipe's 10^4 keeps the rate flat for 5 steps
    cfg = ModelConfig(vocab_size=128, d_model=128, num_heads=1, d_kv=8, d_ff=256,
                      num_layers=2, moe=MoeConfig(num_experts=4, sparse_every=2))
    s = state_lib.setup(cfg, "data_parallel", "data:1", devices=jax.devices()[:1],
                        optimizer=state_lib.run_optimizer(config),
                        router_lr_scale=config.router_learning_rate_scale)
    rng = np.random.default_rng(0)
    shapes = {state_lib.path_name(p): a.shape
              for p, a in jax.tree_util.tree_leaves_with_path(s.abstract.params)}
    flat = {n: (rng.normal(size=shape) * (1e-5 if n.endswith("router/w") else 0.03)
                ).astype(np.float32) for n, shape in shapes.items()}
    experts = {n for n, v in flat.items() if n.split("/")[-1] in ("wi", "wo") and v.ndim == 3}
    assert experts == {"decoder/layers/1/ffn/wi", "decoder/layers/1/ffn/wo"}
    grads = []
    for t in range(1, 6):
        g = {n: rng.normal(size=v.shape).astype(np.float32) * (0.1 if t == 5 else 1.0)
             for n, v in flat.items()}
        if t == 4:
            for n in experts:
                g[n][0] *= 10.0
            g["embed/embedding"] *= 10.0
        grads.append(g)
    want, clip = adafactor_paper(flat, grads, config.learning_rate, config.warmup_steps,
                                 experts)
    wi = "decoder/layers/1/ffn/wi"      # RMS(U) / d: ~1 on steady gradients, 1.7 on the spike
    assert clip[4, wi, 0] > 1.5 and clip[4, "embed/embedding", ...] > 1.5
    assert max(clip[4, wi, e] for e in (1, 2, 3)) < 1.05 and max(
        v for (t, _, _), v in clip.items() if t == 5) < 1

    def as_tree(values):
        return jax.tree_util.tree_map_with_path(
            lambda p, _: jnp.asarray(values[state_lib.path_name(p)]), s.abstract.params)

    update, params = jax.jit(s.tx.update), as_tree(flat)
    opt_state = s.tx.init(params)
    for t, (g, w) in enumerate(zip(grads, want), start=1):
        updates, opt_state = update(as_tree(g), opt_state, params)
        params = optax.apply_updates(params, updates)
        for p, u in jax.tree_util.tree_leaves_with_path(updates):
            name = state_lib.path_name(p)
            np.testing.assert_allclose(np.asarray(u), w[name], rtol=1e-4,
                                       atol=1e-4 * np.abs(w[name]).max(),
                                       err_msg=f"step {t}, {name}")


def test_adafactor_state_of_experts_is_sharded_like_the_experts():
    """The per-expert factored statistics [E, D] / [E, F] keep the experts dim on the expert
    axis (their weight's dims less the one averaged away within a slice)."""
    cfg = ModelConfig(vocab_size=128, d_model=128, num_heads=2, d_kv=16, d_ff=256,
                      num_layers=2, moe=MoeConfig(num_experts=8, sparse_every=2))
    s = state_lib.setup(cfg, "expert_parallel", "expert:8", optimizer="adafactor")
    specs = {state_lib.path_name(p): (x.shape, sh.spec) for (p, x), sh in zip(
        jax.tree_util.tree_leaves_with_path(s.abstract.opt_state),
        jax.tree.leaves(s.shardings.opt_state))}
    rows = {k: v for k, v in specs.items() if "layers/1/ffn/wi" in k and "v_row" in k}
    cols = {k: v for k, v in specs.items() if "layers/1/ffn/wi" in k and "v_col" in k}
    assert [v[0] for v in rows.values()] == [(8, 128)]      # d_ff (largest) averaged away
    assert [v[0] for v in cols.values()] == [(8, 256)]      # d_model averaged away
    for shape, spec in (*rows.values(), *cols.values()):
        assert spec[0] == "expert", spec


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_routing_losses_sum_or_average_over_switch_layers(reduction):
    """Mesh-TF adds every Switch layer's alpha x loss; T5X averages the layers' losses."""
    moe = MoeConfig(num_experts=4, sparse_every=1, group_size=0, loss_reduction=reduction)
    cfg = ModelConfig(vocab_size=64, d_model=32, num_heads=2, d_kv=8, d_ff=64, num_layers=3,
                      moe=moe)
    model = transformer.build(cfg, seed=0)
    ids = jax.random.randint(jax.random.key(1), (2, 8), 0, 64)

    # The model and the layer-by-layer oracle run compiled, one program, not op by op (eager,
    # each of their operations compiles on its own: ~190 compiles, 3x the CPU).
    @nnx.jit
    def losses(model, ids):
        _, stats = model(ids)
        per_layer = []                # the oracle: run the layers one by one, each its own losses
        x = model.embed(ids, jnp.float32)
        positions, segments = jnp.broadcast_to(jnp.arange(8), (2, 8)), jnp.ones((2, 8), jnp.int32)
        mask, _, k_pos, _ = masks.of_stack((2, 8), True, positions, segments)
        bias = model.decoder.relpos(positions, k_pos)
        for layer in model.decoder.layers:
            x, s, _ = layer(x, bias, mask)
            per_layer.append((s["aux_loss"], s["z_loss"]))
        return stats, per_layer

    stats, per_layer = losses(model, ids)
    aux, z = np.array(jax.device_get(per_layer), np.float64).T
    combine = np.sum if reduction == "sum" else np.mean
    np.testing.assert_allclose(float(stats["aux_loss"]), combine(aux), rtol=1e-6)
    np.testing.assert_allclose(float(stats["z_loss"]), combine(z), rtol=1e-6)
    assert len(aux) == 3 and aux.min() > 0


@pytest.mark.parametrize("scope", ["experts", "all"])
def test_momentum_averages_the_experts_or_every_update(scope):
    """expert_momentum=b: each expert's update is the running average b x m + (1 - b) x the
    Adafactor update it would have had (not debiased, as Adafactor's first moment), every other
    parameter's update untouched; momentum=b: every update so; the average is sharded like its
    expert. The same parameters each step, so both optimizers see the same Adafactor updates."""
    cfg = ModelConfig(vocab_size=128, d_model=128, num_heads=2, d_kv=16, d_ff=256,
                      num_layers=2, moe=MoeConfig(num_experts=8, sparse_every=2))
    plain, averaged = (state_lib.setup(
        cfg, "expert_parallel", "expert:8",
        optimizer=state_lib.make_optimizer("adafactor", 0.01, 2,
                                           momentum=b if scope == "all" else 0.0),
        expert_momentum=b if scope == "experts" else 0.0) for b in (0.0, 0.75))
    rng = np.random.default_rng(0)

    def tree(scale):
        return jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape).astype(np.float32)
                                                  * scale), plain.abstract.params)
    params = tree(0.03)
    states = [s.tx.init(params) for s in (plain, averaged)]
    m, experts = None, set()
    for _ in range(3):
        grads = tree(1.0)
        (u, states[0]), (v, states[1]) = (jax.jit(s.tx.update)(grads, st, params)
                                          for s, st in zip((plain, averaged), states))
        m = jax.tree.map(lambda u: 0.25 * u, u) if m is None else jax.tree.map(
            lambda m, u: 0.75 * m + 0.25 * u, m, u)
        for (p, want_avg), plain_u, got in zip(jax.tree_util.tree_leaves_with_path(m),
                                               jax.tree.leaves(u), jax.tree.leaves(v)):
            name = state_lib.path_name(p)
            expert = name.endswith(("ffn/wi", "ffn/wo")) and got.ndim == 3
            experts |= {name} if expert else set()
            np.testing.assert_allclose(got, want_avg if expert or scope == "all" else plain_u,
                                       rtol=1e-5, atol=1e-8, err_msg=name)
    assert experts == {"decoder/layers/1/ffn/wi", "decoder/layers/1/ffn/wo"}
    specs = {state_lib.path_name(p): sh.spec for (p, _), sh in zip(
        jax.tree_util.tree_leaves_with_path(averaged.abstract.opt_state),
        jax.tree.leaves(averaged.shardings.opt_state))}
    averages = {k: v for k, v in specs.items() if "ema" in k and k.endswith("layers/1/ffn/wi")}
    assert averages and all(v[0] == "expert" for v in averages.values()), specs


def test_frozen_routers_learn_until_their_step_and_then_stay():
    """--config.router_freeze_step=N (the run's set-up, state.setup_run): the routers' updates
    are Adafactor's own for steps 0..N-1 and zero from step N on; every other parameter's
    update is untouched throughout."""
    cfg = ModelConfig(vocab_size=128, d_model=128, num_heads=2, d_kv=16, d_ff=256,
                      num_layers=2, moe=MoeConfig(num_experts=8, sparse_every=2))
    config = c4_cpu.get_config()
    config.warmup_steps, config.router_freeze_step = 2, 2
    layout = state_lib.make_layout("data_parallel", "data:1", jax.devices()[:1])
    frozen = state_lib.setup_run(config, layout, cfg)
    plain = state_lib.setup(cfg, layout, optimizer=state_lib.run_optimizer(config))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape), jnp.float32) * 0.03,
                          plain.abstract.params)
    states = [s.tx.init(params) for s in (plain, frozen)]
    routers = set()
    for step in range(4):
        grads = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape), jnp.float32),
                             params)
        (u, states[0]), (v, states[1]) = (jax.jit(s.tx.update)(grads, st, params)
                                          for s, st in zip((plain, frozen), states))
        for (path, want), got in zip(jax.tree_util.tree_leaves_with_path(u), jax.tree.leaves(v)):
            name = state_lib.path_name(path)
            if name.endswith("router/w"):
                routers.add(name)
                assert np.abs(want).max() > 0, name
                np.testing.assert_allclose(got, want if step < 2 else 0.0, rtol=1e-6,
                                           err_msg=f"{name} at step {step}")
            else:
                np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=name)
    assert routers == {"decoder/layers/1/ffn/router/w"}


@pytest.mark.parametrize("model, step, problem", [
    ("dense_sc_cpu", 4000, "set for a dense model"),
    ("switch_sc_cpu_8", 3000, "would never freeze")])
def test_router_freeze_step_is_refused_where_it_means_nothing(model, step, problem):
    config = c4_cpu.get_config()                           # 3,000 steps
    config.model, config.router_freeze_step = model, step
    with pytest.raises(ValueError, match=problem):
        state_lib.run_model_config(config, 1000)


@pytest.mark.parametrize("model, optimizer, momentum, problem", [
    ("dense_sc_cpu", "adafactor", 0.0, "dense model"),
    ("switch_sc_cpu_8", "adamw", 0.0, "b1 0.9"),
    ("switch_sc_cpu_8", "adafactor", 0.9, "not both")])
def test_expert_momentum_is_refused_where_it_means_nothing(model, optimizer, momentum, problem):
    config = c4.get_config()
    config.model, config.optimizer, config.expert_momentum = model, optimizer, 0.9
    config.momentum = momentum
    with pytest.raises(ValueError, match=problem):
        state_lib.run_model_config(config, 1000)


def test_momentum_with_adamw_is_refused():
    config = c4.get_config()
    config.model, config.optimizer, config.momentum = "dense_sc_cpu", "adamw", 0.9
    with pytest.raises(ValueError, match="adamw keeps its own"):
        state_lib.run_model_config(config, 1000)

