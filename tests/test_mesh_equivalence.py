"""One train step of switch_tiny gives the same loss, gradients, optimizer state and updated
parameters on one device and on every mesh under its preset (fp32, rtol 1e-5). The model is
switch_tiny cut to its first two layers, one dense and one Switch: every kind of block the
layouts shard, and half the compile time of the four (depth is tests/test_pipeline.py's
subject).

Adam divides each gradient by its own magnitude, so where a gradient element is tiny next to
its tensor (it cancels to ~0, and a different summation order changes it by more than 1e-5 of
itself) its update direction is noise. The moments are compared at rtol 1e-5 everywhere; the
updated parameters at rtol 1e-5 wherever |g| >= 1e-3 max|g| of their tensor, and elsewhere
only to within one step (2 lr), which any lost shard or double count would break.
"""
import dataclasses
import functools

import jax
import numpy as np
import pytest

from switchzoo import data, layout as L, state as state_lib, steps, zoo

CFG = zoo.get("switch_tiny").replace(num_layers=2)     # a dense block, then a Switch one
LR = 1e-2
TX = state_lib.make_optimizer("adamw", learning_rate=LR, warmup_steps=1)
BATCH = next(data.byte_lm_batches(16, 32, seed=0))


@functools.cache
def start(cfg=CFG):
    """``cfg``'s initial train state (seed 0, host arrays), drawn once on one device: every
    mesh's step starts from these very weights, so a test compares the step alone and compiles
    no initialisation per mesh (tests/test_layers.py checks that a set-up on a mesh draws
    the same weights, and test_pipeline's encoder-decoder case initialises on its stages)."""
    setup = state_lib.setup(cfg, "data_parallel", L.make_mesh("data:1", devices=jax.devices()[:1]),
                            optimizer=TX, seed=0)
    return jax.device_get(setup.init())


def one_step(mesh, preset, cfg=CFG, step=None, init=False):
    """(metrics, gradients, updated parameters, optimizer state) of one step from ``start``
    (``init``: from the set-up's own initialisation on ``mesh`` instead; ``step``: the
    compiled train step of that set-up, where the caller reads its program too)."""
    setup = state_lib.setup(cfg, L.Layout.create(preset, mesh), optimizer=TX, seed=0)
    step = step or steps.make_train_step(setup)
    weights = cfg.replace(pipeline_microbatches=0, pipeline_repeats=1)   # the same weights
    state = setup.init() if init else jax.device_put(start(weights), setup.shardings)
    new_state, metrics = step(state, BATCH)
    metrics, params, opt_state = jax.device_get((metrics, new_state.params, new_state.opt_state))
    # The gradient itself, read off Adam's first moment: one step from zero leaves
    # mu = (1 - b1) g exactly (b1 = 0.9), so the step's own gradient is compared, not a
    # second program's.
    grads = {k: mu / (1 - 0.9) for k, mu in state_lib.moment(opt_state).items()}
    params = {state_lib.path_name(p): x for p, x in jax.tree_util.tree_leaves_with_path(params)}
    return metrics, grads, params, opt_state


@pytest.fixture(scope="module")
def reference():
    return one_step(L.make_mesh("data:1", devices=jax.devices()[:1]), "data_parallel")


def assert_close(got, want, what):
    """rtol 1e-5 elementwise, with an absolute floor of 1e-5 of each tensor's largest entry
    (so values that cancel to ~0 are compared at the tensor's scale)."""
    def check(path, a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        floor = 1e-5 * max(np.max(np.abs(b)), 1e-30)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=floor,
                                   err_msg=f"{what} {jax.tree_util.keystr(path)}")
    jax.tree_util.tree_map_with_path(check, got, want)


@pytest.mark.parametrize("mesh, preset", [
    ("data:8,model:1,expert:1", "data_parallel"),
    ("data:2,model:2,expert:2", "dp_mp_ep"),
    ("data:2,model:1,expert:4", "dp_ep"),
    ("data:1,model:1,expert:8", "expert_parallel"),
    # (model_parallel's heads/d_ff/vocab:model is dp_mp_ep's without its expert axis)
    ("data:4,model:2", "2d"),
])
def test_same_step_on_every_mesh(reference, mesh, preset):
    assert_same_step(one_step(L.make_mesh(mesh), preset), reference)


def test_encoder_decoder_step_is_the_same_under_dp_mp_ep():
    cfg = zoo.get("switch_base_tiny")
    reference = one_step(L.make_mesh("data:1", devices=jax.devices()[:1]), "data_parallel", cfg)
    assert_same_step(one_step(L.make_mesh("data:2,model:2,expert:2"), "dp_mp_ep", cfg), reference)


def assert_same_step(got, reference):
    metrics, grads, params, opt_state = got
    ref_metrics, ref_grads, ref_params, ref_opt = reference
    assert_close(metrics, ref_metrics, "metrics")
    assert_close(grads, ref_grads, "gradient")
    def check_update(path, p, want, g):
        p, want, g = (np.asarray(a, np.float64) for a in (p, want, g))
        sound = np.abs(g) >= 1e-3 * np.max(np.abs(g))
        np.testing.assert_allclose(p[sound], want[sound], rtol=1e-5, atol=1e-7,
                                   err_msg=f"updated parameter {jax.tree_util.keystr(path)}")
        assert np.all(np.abs(p - want) <= 2 * LR * 1.001), jax.tree_util.keystr(path)
    jax.tree_util.tree_map_with_path(check_update, params, ref_params, ref_grads)
    assert_close(opt_state, ref_opt, "optimizer state")
    assert float(metrics["loss"]) > 0 and np.isfinite(float(metrics["loss"]))


def test_adafactor_state_shards_on_the_2d_layout():
    setup = state_lib.setup(CFG, "2d", "data:4,model:2",
                            optimizer=state_lib.make_optimizer("adafactor", 1e-2, 1))
    _, metrics = steps.make_train_step(setup)(setup.init(), BATCH)
    assert np.isfinite(float(metrics["loss"]))


def test_adafactor_factored_statistics_shard_like_their_weights():
    # An expert weight [experts, d_model, d_ff] under expert parallelism: optax keeps v_row
    # without its largest dim and v_col without the second largest; both keep 'experts'.
    cfg = CFG.replace(d_model=128, d_ff=256)     # optax factors dims >= 128
    setup = state_lib.setup(cfg, "expert_parallel", "expert:8",
                            optimizer=state_lib.make_optimizer("adafactor", 1e-2, 1))
    abstract, shardings = setup.abstract, setup.shardings
    found = 0
    leaves = jax.tree_util.tree_leaves_with_path(abstract.opt_state)
    for (path, x), s in zip(leaves, jax.tree.leaves(shardings.opt_state)):
        keys = state_lib.path_name(path).split("/")
        if keys[-1] == "wi" and ("v_row" in keys or "v_col" in keys) and x.ndim == 2:
            assert s.spec[0] == "expert", (keys, s.spec)          # an expert weight's
            found += 1
    assert found == 2                      # v_row and v_col of the one sparse layer


def run_step(cfg, lay, accumulate=1, update_axis=None, weights=None):
    setup = state_lib.setup(cfg, lay, optimizer=TX, seed=0, update_axis=update_axis)
    step = steps.make_train_step(setup, accumulate=accumulate)
    new_state, metrics = step(jax.device_put(start(weights or cfg), setup.shardings), BATCH)
    return jax.device_get((metrics, new_state.params, new_state.opt_state)), setup.shardings


def test_accumulation_weight_update_sharding_and_bfloat16():
    # No router jitter: micro-batches draw their own noise, so only a noise-free step can match.
    cfg = CFG.replace(moe=dataclasses.replace(CFG.moe, jitter=0.0))
    lay = L.Layout.create("dp_ep", "data:2,model:1,expert:4")
    (ref_metrics, ref_params, ref_opt), _ = run_step(cfg, lay)

    def same_step(metrics, params, opt_state):
        np.testing.assert_allclose(metrics["loss"], ref_metrics["loss"], rtol=1e-5)
        np.testing.assert_allclose(metrics["tokens"], ref_metrics["tokens"])
        assert_close(opt_state, ref_opt, "optimizer state")   # Adam's moments see grad scale
        # The moments match; the update itself only to within one Adam step (see the top).
        jax.tree.map(lambda p, w: np.testing.assert_array_less(np.abs(p - w), 2 * LR * 1.001),
                     params, ref_params)
    # Two micro-batches of 8 rows average to the 16-row step (equal token counts per half).
    same_step(*run_step(cfg, lay, accumulate=2)[0])
    # The optimizer state split over 'data' as well: same step, less memory per device.
    got, shardings = run_step(cfg, lay, update_axis="data")
    mu = state_lib.moment(shardings.opt_state)["decoder/layers/0/attn/q"]
    assert "data" in jax.tree.leaves(tuple(mu.spec))
    same_step(*got)
    # bfloat16 activations (router and parameters stay float32): close to the float32 loss.
    (metrics, params, _), _ = run_step(cfg.replace(dtype="bfloat16"), lay, weights=cfg)
    assert jax.tree.leaves(params)[0].dtype == np.float32
    np.testing.assert_allclose(metrics["loss"], ref_metrics["loss"], rtol=2e-2)
