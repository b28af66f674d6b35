"""One train step of switch_tiny gives the same loss, gradients, optimizer state and updated
parameters on one device and on every mesh under its preset (fp32, rtol 1e-5).

Adam divides each gradient by its own magnitude, so where a gradient is ~1e-8 (Adam's eps) a
1e-5 relative difference in it, from a different summation order, moves the update by far more
than 1e-5. The moments are compared at rtol 1e-5; the updated parameters at 1% of one step
(lr), which a sharding bug (a lost shard, a double count) would exceed by orders of magnitude.
"""
import jax
import numpy as np
import pytest

from switchzoo import data, layout as L, training, zoo

CFG = zoo.get("switch_tiny")
LR = 1e-2
TX = training.make_optimizer("adamw", learning_rate=LR, warmup_steps=1)
BATCH = next(data.byte_lm_batches(16, 32, seed=0))


def one_step(mesh, preset):
    lay = L.Layout.create(preset, mesh)
    graphdef, state, shardings = training.init_state(CFG, TX, lay, seed=0)
    loss_fn = training.make_loss_fn(graphdef, CFG, lay, seed=0)
    grad_fn = jax.jit(jax.grad(loss_fn, has_aux=True),
                      in_shardings=(shardings.params, training.batch_shardings(lay), None),
                      out_shardings=(shardings.params, None))
    grads, _ = grad_fn(state.params, BATCH, state.step)
    step = training.make_train_step(graphdef, CFG, TX, lay, shardings, seed=0)
    new_state, metrics = step(state, BATCH)
    return jax.device_get((metrics, grads, new_state.params, new_state.opt_state))


@pytest.fixture(scope="module")
def reference():
    return one_step(L.make_mesh("data:1", devices=jax.devices()[:1]), "data_parallel")


def assert_close(got, want, what, atol=None):
    """rtol 1e-5 elementwise, with an absolute floor of 1e-5 of each tensor's largest entry
    (so values that cancel to ~0 are compared at the tensor's scale)."""
    def check(path, a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        floor = atol if atol is not None else 1e-5 * max(np.max(np.abs(b)), 1e-30)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=floor,
                                   err_msg=f"{what} {jax.tree_util.keystr(path)}")
    jax.tree_util.tree_map_with_path(check, got, want)


@pytest.mark.parametrize("mesh, preset", [
    ("data:8,model:1,expert:1", "data_parallel"),
    ("data:2,model:2,expert:2", "dp_mp_ep"),
    ("data:1,model:2,expert:4", "dp_mp_ep"),
    ("data:2,model:1,expert:4", "dp_ep"),
    ("data:1,model:1,expert:8", "expert_parallel"),
    ("data:4,model:2,expert:1", "model_parallel"),
    ("data:4,model:2", "2d"),
])
def test_same_step_on_every_mesh(reference, mesh, preset):
    metrics, grads, params, opt_state = one_step(L.make_mesh(mesh), preset)
    ref_metrics, ref_grads, ref_params, ref_opt = reference
    assert_close(metrics, ref_metrics, "metrics")
    assert_close(grads, ref_grads, "gradient")
    assert_close(params, ref_params, "updated parameter", atol=1e-2 * LR)
    assert_close(opt_state, ref_opt, "optimizer state")
    assert float(metrics["loss"]) > 0 and np.isfinite(float(metrics["loss"]))


def test_adafactor_state_shards_on_the_2d_layout():
    tx = training.make_optimizer("adafactor", 1e-2, 1)
    lay = L.Layout.create("2d", "data:4,model:2")
    graphdef, state, shardings = training.init_state(CFG, tx, lay)
    step = training.make_train_step(graphdef, CFG, tx, lay, shardings)
    _, metrics = step(state, BATCH)
    assert np.isfinite(float(metrics["loss"]))
