"""Scanned layers and rematerialisation change how the model runs, never what it computes:
oracles are the unrolled model on the same weights (moved between the forms by
transformer.stack_layers / unstack_layers) and the step without rematerialisation."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax._src.ad_checkpoint import saved_residuals

from switchzoo import decoding, hf, moe, state, steps, transformer, validate, zoo
from switchzoo.config import ModelConfig
from switchzoo.configs import base

TINY = zoo.get("switch_tiny")           # decoder-only; 4 layers, every 2nd sparse: 2 groups
# An encoder-decoder deep enough to repeat its (dense, sparse) pair twice in each stack.
# T5's init (the Switch catalogue's 0.1 leaves a fresh tiny model's logits near-uniform: its
# decoded tokens would hardly vary, and a decoding comparison would test little)
ENC_DEC = zoo.get("switch_base_tiny").replace(num_layers=4, num_encoder_layers=4,
                                              init_scale=1.0, init_distribution="normal")


@functools.cache
def pure_params(cfg: ModelConfig) -> dict:
    """The model's initial parameters (built once per config; callers never mutate them)."""
    return nnx.to_pure_dict(nnx.state(transformer.build(cfg)))


def max_diff(a, b) -> float:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    return max(float(np.max(np.abs(np.asarray(x, np.float32) - np.asarray(y, np.float32))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def batch(rows: int = 4, length: int = 64) -> dict:
    ids = np.random.default_rng(0).integers(2, TINY.vocab_size, (rows, length)).astype(np.int32)
    return {"inputs": ids, "targets": ids, "weights": np.ones(ids.shape, np.float32)}


def loss_and_logits(cfg: ModelConfig):
    """(loss_fn(params) -> (loss, logits) of a training forward pass of ``batch()`` with router
    jitter on: every layer draws its own key; params in the form ``cfg`` runs)."""
    s, data = state.setup(cfg, "data_parallel", "data:1", devices=jax.devices()[:1]), batch()

    def loss(params):
        logits, aux = steps.forward(nnx.merge(s.graphdef, params), cfg, s.layout, data,
                                    jax.random.key(1))
        return steps.lm_objective(logits, data, aux, cfg)[0], logits
    return loss


def test_scanned_and_rematerialised_steps_compute_the_unrolled_one_in_less_memory():
    """switch_tiny's forward + backward from the same weights, unrolled and scanned, scanned
    under each remat policy (each compiled once): the same loss, logits and gradients, and
    smaller temporaries the more a policy recomputes. One test, not one per comparison on a
    shared fixture: pytest-xdist's worksteal may split a module's tests over two workers, and
    each would compile the five programs (~12 CPU-s)."""
    unrolled, runs = pure_params(TINY), {}
    for scan, remat in ((False, "none"), (True, "none"), (True, "full"), (True, "dots"),
                        (True, "minimal")):
        cfg = TINY.replace(scan_layers=scan, remat=remat)
        params = transformer.layers_as(unrolled, cfg)
        compiled = jax.jit(jax.value_and_grad(loss_and_logits(cfg), has_aux=True)).lower(
            params).compile()
        (value, logits), grads = compiled(params)
        runs[scan, remat] = (value, logits, transformer.unstack_layers(grads, cfg),
                             compiled.memory_analysis().temp_size_in_bytes)

    # Scanned layers compute the unrolled logits and gradients.
    loss, logits, grads, _ = runs[False, "none"]
    s_loss, s_logits, s_grads, _ = runs[True, "none"]
    assert abs(float(loss - s_loss)) < 1e-6
    assert max_diff(logits, s_logits) < 1e-5
    assert max_diff(grads, s_grads) < 1e-6
    assert max_diff(grads, jax.tree.map(jnp.zeros_like, grads)) > 1e-3    # not all zero
    # Rematerialisation gives the same loss and gradients, whatever the policy.
    for remat in ("full", "dots", "minimal"):
        r_loss, r_logits, r_grads, _ = runs[True, remat]
        assert abs(float(s_loss - r_loss)) < 1e-6, remat
        assert max_diff(s_logits, r_logits) < 1e-5, remat
        assert max_diff(s_grads, r_grads) < 1e-6, remat
    # ... and lowers the scanned step's temporaries. The scan's backward loop recomputes one
    # group at a time. Unrolled, XLA:CPU compiles the recomputation in but its temporaries stay
    # as they were (also for a plain jax.checkpoint'd chain of matmuls), so the claim is tested
    # where the backend keeps it: docs/benchmarks.md.
    none, full, dots, minimal = (runs[True, r][3] for r in ("none", "full", "dots", "minimal"))
    assert full < 0.7 * none, (full, none)
    assert dots < none, (dots, none)
    assert minimal < dots, (minimal, dots)


@pytest.mark.parametrize("remat", ["full", "dots", "minimal"])
def test_an_unrolled_stack_checkpoints_each_block_with_its_policy(remat):
    """Per block, the same jax.checkpoint as the scanned group (whose values are tested above);
    traced, not compiled."""
    def checkpoints(cfg):
        jaxpr = jax.make_jaxpr(loss_and_logits(cfg))(pure_params(TINY)).jaxpr
        return [e for e in jaxpr.eqns if e.primitive.name == "remat2"]   # jax.checkpoint's
    blocks = checkpoints(TINY.replace(remat=remat))
    assert len(blocks) == TINY.num_layers
    assert all(e.params["policy"] is transformer.REMAT_POLICIES[remat] for e in blocks)
    assert not checkpoints(TINY)


@pytest.mark.parametrize("cfg", [TINY, ENC_DEC], ids=["decoder_only", "encoder_decoder"])
def test_a_checkpoint_of_either_form_loads_in_the_other(cfg):
    unrolled, scanned = pure_params(cfg), pure_params(cfg.replace(scan_layers=True))
    assert "scanned" in scanned["decoder"] and "layers" not in scanned["decoder"]
    # A scanned model is born with the unrolled model's weights, stacked.
    assert max_diff(transformer.stack_layers(unrolled, cfg), scanned) == 0
    assert max_diff(transformer.unstack_layers(scanned, cfg), unrolled) == 0
    # layers_as takes either form to the one a config runs.
    assert max_diff(transformer.layers_as(scanned, cfg), unrolled) == 0
    assert max_diff(transformer.layers_as(unrolled, cfg.replace(scan_layers=True)), scanned) == 0
    wi = scanned["decoder"]["scanned"][1]["ffn"]["wi"]           # layers 1 and 3
    assert np.array_equal(wi[1], unrolled["decoder"]["layers"][3]["ffn"]["wi"])


def test_hugging_face_export_of_a_scanned_model_writes_per_layer_names_and_loads_back(tmp_path):
    # fixed slots per sequence: the routing a Hugging Face checkpoint can hold
    cfg = ENC_DEC.replace(scan_layers=True,
                          moe=dataclasses.replace(ENC_DEC.moe, expert_capacity=16))
    params = pure_params(cfg)
    hf.save(tmp_path, cfg, params)
    pretrained = hf.read_config(tmp_path)
    assert "decoder.block.3.layer.2.mlp.router.classifier.weight" in pretrained.files
    assert not any("scanned" in name for name in pretrained.files)
    setup = state.setup(pretrained.cfg.replace(scan_layers=True), "data_parallel", "data:1",
                        devices=jax.devices()[:1])
    loaded, _ = hf.load_params(pretrained, setup)
    assert max_diff(loaded, params) == 0


def test_a_scanned_model_decodes_as_the_unrolled_one():
    """Decoding runs the scanned weights layer by layer with the per-layer cache; the encoder
    runs through the scan."""
    unrolled = pure_params(ENC_DEC)
    src = jnp.asarray(np.random.default_rng(1).integers(2, ENC_DEC.vocab_size, (2, 12)),
                      jnp.int32)
    out = []
    for cfg in (ENC_DEC, ENC_DEC.replace(scan_layers=True)):
        graphdef = nnx.graphdef(transformer.build(cfg))
        out.append(decoding.sample(graphdef, transformer.layers_as(unrolled, cfg), src,
                                   jnp.ones_like(src), jax.random.key(0), max_new=6,
                                   greedy=False))     # sampled: greedy repeats one token here
    np.testing.assert_array_equal(out[0], out[1])
    assert len(np.unique(np.asarray(out[0]))) > 4


def test_the_optimizer_updates_stacked_parameters_layer_by_layer():
    """Adafactor scales each update by its parameter's RMS: over a stacked array it would mix
    the layers, so state.per_layer maps it over them."""
    # A few parameters, stacked ones (scaled per layer) and one not.
    decoder = pure_params(TINY)["decoder"]
    layers = {i: {"attn": {"q": layer["attn"]["q"] * (i + 1)}}
              for i, layer in decoder["layers"].items()}
    unrolled = {"decoder": {"final_norm": decoder["final_norm"], "layers": layers}}
    grads = jax.tree.map(lambda x: jnp.cos(3 * x), unrolled)
    stacked, stacked_grads = (transformer.stack_layers(t, TINY) for t in (unrolled, grads))
    tx = optax.adafactor(1e-2)

    @jax.jit
    def updates(grads, params, stacked_grads, stacked):
        layerwise = state.per_layer(tx, stacked)
        return (tx.update(grads, tx.init(params), params)[0],
                layerwise.update(stacked_grads, layerwise.init(stacked), stacked)[0],
                tx.update(stacked_grads, tx.init(stacked), stacked)[0])
    want, got, whole = updates(grads, unrolled, stacked_grads, stacked)
    assert max_diff(transformer.unstack_layers(got, TINY), want) < 1e-7
    # What it prevents: the update of the whole stacked array is not the layers' updates.
    assert max_diff(transformer.unstack_layers(whole, TINY), want) > 1e-5


def test_an_unknown_remat_policy_is_a_one_line_error_naming_the_choices():
    config = base.get_base()
    config.remat = "everything"
    with pytest.raises(ValueError, match=r"^--config.remat='everything' is not one of none, "
                                         r"full, dots, minimal$"):
        validate.check(config)
    with pytest.raises(ValueError, match=r"^remat='dot' is not a rematerialisation policy; use "
                                         r"one of none, full, dots, minimal$"):
        TINY.replace(remat="dot")


def test_the_scanned_group_is_the_shortest_repeating_run_of_layers():
    assert transformer.scan_period(TINY, 4) == 2                     # (dense, sparse) x 2
    assert transformer.scan_period(zoo.get("switch_c_2048"), 15, encoder=True) == 1
    assert transformer.scan_period(zoo.get("dense_tiny"), 4) == 1
    assert transformer.scan_period(TINY, 3) == 3                     # dense, sparse, dense


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_minimal_remat_saves_no_attention_scores_nor_routing_masks(scan):
    """remat "minimal" keeps the projections and the attention context for the backward pass:
    none of the [B, H, T, S] scores/probabilities (self and cross) and no [G, N, E, C] routing
    mask (the einsum dispatch's) among the loss's saved residuals, which remat "none" saves.
    Scanned, a residual has the groups' leading dim; the bias [1, H, T, S] (one per stack, an
    input of every block) may stay."""
    cfg = ENC_DEC.replace(scan_layers=scan, moe=dataclasses.replace(ENC_DEC.moe,
                                                                    dispatch="einsum"))
    B, S, T = 2, 48, 32
    src = jnp.asarray(np.random.default_rng(0).integers(2, cfg.vocab_size, (B, S)), jnp.int32)
    tgt = src[:, :T]
    N = cfg.moe.group_size
    attention = {(cfg.num_heads, t, s) for t, s in ((S, S), (T, T), (T, S))}
    routing = {(moe.num_groups(B, L, N), N, cfg.moe.num_experts,
                cfg.moe.capacity(N, train=True)) for L in (S, T)}

    def forbidden(remat):
        c = cfg.replace(remat=remat)
        graphdef, params = nnx.split(transformer.build(c))

        def loss(params):
            logits, aux = nnx.merge(graphdef, params)(src, tgt, rng=jax.random.key(0))
            return jnp.sum(logits) + aux["aux_loss"]
        shapes = [tuple(aval.shape) for aval, _ in saved_residuals(loss, params)]
        return ([s for s in shapes if len(s) >= 4 and s[-4] == B and s[-3:] in attention],
                [s for s in shapes if len(s) >= 4 and s[-4:] in routing])
    scores, masks = forbidden("minimal")
    assert not scores and not masks, (scores, masks)
    scores, masks = forbidden("none")
    assert scores and masks            # what "minimal" leaves out
