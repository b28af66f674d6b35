"""A Switch layer of one expert is the dense FFN it replaces, in training too: the span study's
control for the Switch code path (router, dispatch and combine, the per-expert Adafactor). With
the dense model's weights (upcycled), a few Adafactor steps of the span recipe leave the
one-expert model's cross-entropy and every weight where dense's steps leave dense's (the
expert's, the FFN's); so a Switch model's deficit against dense comes from routing tokens
between experts, not from the layer's machinery."""
import itertools

import jax
import numpy as np

from switchzoo import data, steps, upcycle
from switchzoo import state as state_lib
from switchzoo.configs import c4_cpu

ONE_DEVICE = dict(layout="data_parallel", mesh="data:1", devices=jax.devices()[:1])


def span_recipe(model: str, **moe):
    """experiments/span_runs.py's run at 0.04 (configs/c4_cpu.py: Adafactor, rsqrt), a short
    warm-up: (its model, its set-up on one device)."""
    config = c4_cpu.get_config(f"model={model}")
    config.learning_rate, config.warmup_steps = 0.04, 2
    for k, v in moe.items():
        config.moe[k] = v
    cfg = state_lib.run_model_config(config, 512)
    return cfg, state_lib.setup(cfg, optimizer=state_lib.run_optimizer(config), **ONE_DEVICE)


def test_a_switch_layer_of_one_expert_trains_as_the_dense_ffn_it_replaces():
    _, dense = span_recipe("dense_sc_cpu")
    one, switch = span_recipe("switch_sc_cpu_1", jitter=0.0)     # the span runs' no-jitter
    assert one.moe.num_experts == 1 and one.moe.aux_loss_weight > 0
    d_state = dense.init()
    s_state = switch.state_from(upcycle.upcycle_params(d_state.params, one, seed=1))
    d_step, s_step = steps.make_train_step(dense), steps.make_train_step(switch)
    for batch in itertools.islice(data.byte_lm_batches(8, 24, seed=2), 3):
        d_state, d_metrics = d_step(d_state, batch)
        s_state, s_metrics = s_step(s_state, batch)
        np.testing.assert_allclose(float(s_metrics["cross_entropy"]),
                                   float(d_metrics["cross_entropy"]), rtol=1e-5)

    def flat(params) -> dict:
        return {state_lib.path_name(p): np.asarray(x)
                for p, x in jax.tree_util.tree_leaves_with_path(jax.device_get(params))}
    want = flat(d_state.params)
    start = flat(dense.init().params)
    experts = 0
    for name, got in flat(s_state.params).items():
        if "/router/" in name:
            continue                        # the router: its one gate is 1 whatever it is
        if switch.dims[name][0] == "experts":
            got, experts = got[0], experts + 1
        np.testing.assert_allclose(got, want[name], rtol=2e-5, atol=1e-7, err_msg=name)
    assert experts == 4                     # wi and wo of the encoder's and decoder's Switch layer
    ffn = "decoder/layers/1/ffn/wi"
    assert np.abs(want[ffn] - start[ffn]).max() > 1e-3     # the steps moved what is compared
