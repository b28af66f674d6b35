"""Layers: T5 relative-position buckets, RMSNorm, causal decoders (dense and Switch), and the
communication of the Megatron and 2D presets on single blocks."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from switchzoo import layout as L, state as state_lib, transformer, zoo
from switchzoo.inspector import count_collectives
from switchzoo.layers import Attention, Mlp, RMSNorm
from switchzoo.relpos import relpos_bucket


@pytest.mark.parametrize("rel, bidirectional, bucket", [
    # key - query; worked by hand from T5's formula with 32 buckets, max distance 128.
    (0, True, 0), (-1, True, 1), (1, True, 17), (-7, True, 7), (-20, True, 10), (20, True, 26),
    (-200, True, 15), (0, False, 0), (5, False, 0), (-15, False, 15), (-20, False, 17),
    (-1000, False, 31),
])
def test_relpos_buckets_match_t5(rel, bidirectional, bucket):
    got = relpos_bucket(jnp.array([[[rel]]]), bidirectional, 32, 128)
    assert int(got[0, 0, 0]) == bucket


def test_rmsnorm_scales_to_unit_rms_in_float32():
    x = jax.random.normal(jax.random.key(0), (2, 3, 8)).astype(jnp.bfloat16) * 5
    y = RMSNorm(8)(x)
    assert y.dtype == jnp.bfloat16
    rms = np.sqrt(np.mean(np.square(np.asarray(y, np.float32)), -1))
    np.testing.assert_allclose(rms, 1.0, rtol=1e-2)


def causal_lm(cfg):
    model = nnx.jit(lambda m, ids, **kw: m(ids, **kw))    # compiled once per shape, not op by op
    return functools.partial(model, transformer.build(cfg))


# switch_tiny's Switch layers (top-1) with each sequence its own routing group (group_size 0)
# and room for every token (16 slots: 16 tokens x 8.0 / 8 experts), through the einsum dispatch
# (with that room "auto" would pick dropless, where tokens never meet).
SWITCH_ROW_GROUPS = dataclasses.replace(
    zoo.get("switch_tiny").moe, group_size=0, eval_capacity_factor=8.0, min_capacity=1,
    dispatch="einsum")


@pytest.mark.parametrize("moe", [
    None, SWITCH_ROW_GROUPS,
    # 1 slot per expert (16 x 0.5 / 8): top-1 serves a group in position order, so its drops
    # are causal too (packed sequences then share their row's slots: not checked).
    dataclasses.replace(SWITCH_ROW_GROUPS, eval_capacity_factor=0.5)],
    ids=["dense", "switch", "switch_dropping"])
def test_decoder_is_causal_and_respects_segments(moe):
    """A Switch decoder (top-1) is causal where each sequence is its own routing group. Where
    a group spans several rows, rows of a group can affect each other through capacity (an
    earlier row's tokens take the slots first: test_capacity_couples_the_rows_of_a_group)."""
    model = causal_lm(zoo.get("switch_tiny").replace(moe=moe))
    ids = jax.random.randint(jax.random.key(1), (2, 16), 1, 256)
    changed = ids.at[:, 10:].set(7)
    a, stats = model(ids)
    b, _ = model(changed)
    np.testing.assert_allclose(a[:, :10], b[:, :10], rtol=1e-6, atol=1e-6)
    assert not np.allclose(a[:, 10:], b[:, 10:])
    dropping = moe is not None and moe.eval_capacity_factor < 1
    if moe is not None:
        assert np.all((np.asarray(stats["dropped_fraction"]) > 0) == dropping)
    if not dropping:       # two packed sequences: the second does not see the first
        segments = jnp.concatenate([jnp.ones((2, 8), jnp.int32),
                                    2 * jnp.ones((2, 8), jnp.int32)], 1)
        positions = jnp.concatenate([jnp.arange(8), jnp.arange(8)])[None].repeat(2, 0)
        packed, _ = model(ids, positions_BL=positions, segments_BL=segments)
        alone, _ = model(ids[:, 8:])
        np.testing.assert_allclose(packed[:, 8:], alone, rtol=1e-5, atol=1e-5)


def test_positions_that_are_not_consecutive_within_a_segment_are_refused():
    """The relative-position bias reads token order: a segment's positions must run n, n+1, ...
    (any start: a sequence packed at an offset computes what it computes alone). Checked on
    concrete arrays, as here (under jit they are the caller's promise; the model's callers in
    switchzoo pass packing's positions or none)."""
    model = transformer.build(zoo.get("switch_tiny").replace(moe=SWITCH_ROW_GROUPS, num_layers=1))
    ids = jax.random.randint(jax.random.key(1), (1, 8), 1, 256)
    shifted, _ = model(ids, positions_BL=jnp.arange(5, 13)[None])
    np.testing.assert_allclose(shifted, model(ids)[0], rtol=1e-5, atol=1e-5)
    gap = jnp.array([[0, 1, 2, 3, 5, 6, 7, 8]])
    with pytest.raises(ValueError, match="not consecutive within segment 1 of row 0: token 4 "
                                         "has position 5, not 4"):
        model(ids, positions_BL=gap)
    segments = jnp.array([[1, 1, 1, 1, 2, 2, 0, 0]])      # a new segment may restart; padding
    model(ids, positions_BL=jnp.array([[0, 1, 2, 3, 0, 1, 9, 9]]), segments_BL=segments)


def test_capacity_couples_the_rows_of_a_group():
    """One routing group over both rows with 1 slot per expert (32 tokens x 0.25 / 8): top-1
    routing serves tokens in group order, row 0 before row 1, so changing row 0's later
    tokens changes row 1's earliest positions, which a row of its own would never see; and
    row 0 itself stays causal."""
    moe = dataclasses.replace(SWITCH_ROW_GROUPS, group_size=32, eval_capacity_factor=0.25,
                              eval_groups="train")     # training's groups (the subject here)
    model = causal_lm(zoo.get("switch_tiny").replace(moe=moe))
    ids = jax.random.randint(jax.random.key(1), (2, 16), 1, 256)
    a, stats = model(ids)
    b, _ = model(ids.at[0, 10:].set(7))
    assert np.all(np.asarray(stats["dropped_fraction"]) > 0)
    np.testing.assert_allclose(a[0, :10], b[0, :10], rtol=1e-6, atol=1e-6)
    assert not np.allclose(a[1, :10], b[1, :10], rtol=1e-4, atol=1e-4)


def compiled_collectives(module, preset, mesh, call, grad=False):
    graphdef, state = nnx.split(module)
    lay = L.Layout.create(preset, mesh)
    dims = state_lib.module_dims(module)
    params = nnx.to_pure_dict(state)
    shardings = state_lib.tree_shardings(lay, params, dims, params)
    x_sharding = lay.sharding(("batch", "length", "d_model"), strict=False)

    def f(params, x):
        with L.use(lay):
            out = call(nnx.merge(graphdef, params), x)
        return jnp.sum(out[0] if isinstance(out, tuple) else out)

    # Gradients leave sharded like their weights, as the train step's update requires.
    fn = jax.jit(jax.grad(f) if grad else f, in_shardings=(shardings, x_sharding),
                 out_shardings=shardings if grad else None)
    x = jax.ShapeDtypeStruct((8, 16, 64), jnp.float32)
    compiled = fn.lower(params, x).compile()
    return count_collectives(compiled.as_text()), compiled, shardings


def test_megatron_preset_needs_one_all_reduce_per_block_forward():
    mask, bias = jnp.ones((8, 16, 16), bool), jnp.zeros((8, 8, 16, 16))
    rngs = nnx.Rngs(0)
    mlp, _, _ = compiled_collectives(Mlp(64, 128, rngs), "model_parallel", "data:1,model:8",
                                     lambda m, x: m(x))
    attn, _, _ = compiled_collectives(Attention(64, 8, 16, rngs), "model_parallel",
                                      "data:1,model:8", lambda m, x: m(x, x, bias, mask))
    for counts in (mlp, attn):
        assert counts == {"all-to-all": 0, "all-reduce": 1, "all-gather": 0,
                          "reduce-scatter": 0, "collective-permute": 0}


def test_2d_preset_gathers_weights_before_the_matmuls_and_keeps_gradients_sharded():
    mlp = Mlp(64, 128, nnx.Rngs(0))
    fwd, _, _ = compiled_collectives(mlp, "2d", "data:4,model:2", lambda m, x: m(x))
    assert fwd["all-gather"] == 2          # wi and wo, each gathered over 'data' before use
    bwd, _, shardings = compiled_collectives(mlp, "2d", "data:4,model:2", lambda m, x: m(x),
                                             grad=True)
    assert jax.tree.leaves(shardings)[0].spec == jax.sharding.PartitionSpec("data", "model")
    # Weight gradients are summed over 'data' and kept split over both axes. XLA's CPU pipeline
    # does this as all-reduce + slice; the GPU/TPU pipelines fuse it into a reduce-scatter.
    assert bwd["all-reduce"] + bwd["reduce-scatter"] >= 1
    assert bwd["all-gather"] == 2           # the weights again, for the backward matmuls


@pytest.mark.parametrize("name", ["switch_base_tiny", "switch_tiny"])
def test_a_set_up_initialises_the_weights_the_model_draws(name):
    """Setup.init batches the parameters' random draws (draws.draw_all); each weight is still
    the one transformer.build draws from its own key (to rounding: the tests compile without
    LLVM's optimisations, which can round the batched and the single draw differently), and
    the seed still decides them."""
    cfg = zoo.get(name).replace(scan_layers=name == "switch_tiny")
    setup = state_lib.setup(cfg, "dp_ep", "data:2,model:2,expert:2", seed=3)
    got = jax.device_get(setup.init())
    want = jax.device_get(nnx.to_pure_dict(nnx.state(transformer.build(cfg, 3))))
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for path, a in jax.tree_util.tree_leaves_with_path(got):
        b = functools.reduce(lambda t, k: t[k.key], path, want)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6 * max(1.0, float(np.abs(b).max())),
                                   err_msg=jax.tree_util.keystr(path))
    other = jax.device_get(state_lib.setup(cfg, "dp_ep", "data:2,model:2,expert:2",
                                           seed=4).init())
    assert not np.allclose(jax.tree.leaves(other)[-1], jax.tree.leaves(got)[-1])
