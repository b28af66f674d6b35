"""Orbax checkpoints: the newest ``keep`` are kept, and the parameters restore alone (their own
item, no optimizer built), equal to what was saved and in the shardings asked for."""
import jax
import numpy as np

from switchzoo import checkpoints, zoo
from switchzoo import state as state_lib


def small_setup(optimizer="adamw"):
    return state_lib.setup(zoo.get("switch_tiny").replace(num_layers=2), "dp_ep",
                           "data:2,model:1,expert:4", optimizer=optimizer)


def test_keeps_the_newest_n_and_restores_params_alone(tmp_path):
    setup = small_setup()
    state = setup.init()
    ckpt = checkpoints.Checkpoints(tmp_path, every=1, keep=2, use_async=False)
    for step in range(1, 6):
        state = state._replace(step=state.step + 1)
        assert ckpt.save(step, state, {"position": step})
    ckpt.wait()
    assert ckpt.all_steps() == [4, 5] and ckpt.latest_step() == 5
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["4", "5"]
    assert {p.name for p in (tmp_path / "5").iterdir()} >= {"params", "optimizer", "data"}

    # Evaluation: the parameters only, under another layout, without an optimizer.
    params_only = state_lib.setup(setup.cfg, "expert_parallel", "expert:8")
    params = ckpt.restore_params(5, params_only.abstract, params_only.shardings)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(params),
                 jax.device_get(state.params))
    jax.tree.map(lambda x, s: np.testing.assert_equal(x.sharding.spec, s.spec), params,
                 params_only.shardings)

    # Training: everything, including the step and the data iterator's state.
    restored, data = ckpt.restore(5, setup.abstract, setup.shardings)
    assert int(restored.step) == 5 and data == {"position": 5}
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored.opt_state),
                 jax.device_get(state.opt_state))
    ckpt.close()


def test_save_follows_the_interval(tmp_path):
    setup = small_setup()
    state = setup.init()
    ckpt = checkpoints.Checkpoints(tmp_path, every=3, keep=5, use_async=False)
    saved = [step for step in range(1, 8) if ckpt.save(step, state, {})]
    assert ckpt.save(8, state, {}, force=True)        # the final step is saved regardless
    ckpt.close()
    assert saved == [3, 6]
    assert ckpt.all_steps() == [3, 6, 8]
