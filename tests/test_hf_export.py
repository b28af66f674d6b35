"""What switchzoo writes in Hugging Face format is the model transformers computes, or is refused
in one line; a model read from Hugging Face trains on transformers' loss, router losses and all.
Random models, built here (no downloads)."""
import dataclasses

import jax
import numpy as np
import pytest

import switchzoo
from switchzoo import api, hf, hf_export, steps, upcycle, weights
from switchzoo import state as state_lib
from switchzoo.config import ModelConfig, MoeConfig

from test_hf import inputs, reference_logits, t5_checkpoint
from conftest import Lazy

torch, transformers = Lazy("torch"), Lazy("transformers")
switch_transformers = Lazy(
    "transformers.models.switch_transformers.modeling_switch_transformers")

ONE_DEVICE = dict(layout="data_parallel", mesh="data:1", devices=jax.devices()[:1])
# Routed per sequence with room for every token, as transformers routes: capacity then changes
# nothing, so any difference is the model's.
MOE = MoeConfig(num_experts=4, group_size=0, expert_capacity=64, sparse_every=2,
                sparse_offset=1)
BASE = ModelConfig(vocab_size=96, d_model=32, num_heads=4, d_kv=8, d_ff=48, num_layers=2,
                   num_encoder_layers=3, moe=MOE)


def moe(**kw) -> ModelConfig:
    return BASE.replace(moe=dataclasses.replace(MOE, **kw))


def random_model(cfg: ModelConfig, seed: int = 1) -> api.Model:
    """``cfg`` on one device with random normal weights (std 0.3: routers far from uniform),
    drawn in numpy: only the forward pass compiles."""
    s = state_lib.setup(cfg, **ONE_DEVICE)
    rng = np.random.default_rng(seed)
    params = jax.tree.map(lambda a: (0.3 * rng.standard_normal(a.shape)).astype(np.float32),
                          s.abstract_params)
    return api.Model(s.cfg, s.graphdef, params, s.layout)


SAVED = {   # transformers must compute these as switchzoo does
    "switch_tied": BASE,
    # untied, every block sparse, and training- or execution-only settings: jitter, dropout,
    # the routing losses, dispatch, scanned layers
    "switch_untied_every_block": moe(sparse_every=1, jitter=0.1, expert_dropout=0.4,
                                     dispatch="einsum", aux_loss_weight=0.3,
                                     loss_reduction="mean").replace(
        tie_embeddings=False, dropout=0.2, scan_layers=True, num_encoder_layers=2),
    "dense_gated": BASE.replace(moe=None, activation="gated-gelu"),     # written as T5
}
REFUSED = {
    "gates_sum_to_one": (moe(gates_sum_to_one=True), "moe.gates_sum_to_one: transformers "
                         "scales each expert's output by the raw router probability"),
    "top_2": (moe(top_k=2), "moe.top_k=2: SwitchTransformers routes each token to one expert"),
    "experts_choose": (moe(router="experts_choose"), "routes tokens-choose only"),
    "gated_experts": (BASE.replace(activation="gated-gelu"), "experts are ReLU"),
    "shared_experts": (moe(num_shared_experts=1), r"the model has shared experts"),
    "balance_bias": (moe(balance="bias"), r"the model has a router balancing bias"),
    "decoder_only": (BASE.replace(num_encoder_layers=0), "a decoder-only model"),
    "dense_decoder_only": (BASE.replace(num_encoder_layers=0, moe=None), "a decoder-only model"),
    "dense_untied": (BASE.replace(moe=None, tie_embeddings=False), "T5 always ties it"),
    # transformers puts a 3-block stack's one sparse layer at block 1, and never has none
    "other_sparse_layers": (moe(encoder_sparse_layers=(2,)),
                            r"the encoder's Switch layers are \[2\], but transformers makes "
                            r"blocks \[1\]"),
    "a_dense_stack": (moe(encoder_sparse_layers=()), r"the encoder's Switch layers are \[\]"),
}


@pytest.mark.parametrize("name", sorted(SAVED))
def test_a_saved_model_computes_the_same_logits_in_transformers(name, tmp_path):
    ours = random_model(SAVED[name])
    ours.save_pretrained(tmp_path)
    theirs = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    src, mask, dec = inputs(BASE.vocab_size)
    got = np.asarray(ours(src, attention_mask=mask, decoder_input_ids=dec))
    np.testing.assert_allclose(got, reference_logits(theirs, src, mask, dec), atol=1e-4)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_model_transformers_would_compute_otherwise_is_refused_in_one_line(name, tmp_path):
    cfg, message = REFUSED[name]
    with pytest.raises(hf.CheckpointError, match=message) as e:
        hf.save(tmp_path / "out", cfg, state_lib.abstract_model(cfg)[1])
    line = str(e.value)
    assert line.startswith("cannot save in Hugging Face format: ") and "\n" not in line
    assert "keep it in switchzoo checkpoints" in line
    assert not (tmp_path / "out").exists()


def test_without_the_refusal_transformers_would_compute_another_model(tmp_path, monkeypatch):
    """The refusal is needed: renormalised gates written anyway give transformers other
    logits (its top-1 scales each expert by the raw probability)."""
    src, mask, dec = inputs(BASE.vocab_size)
    monkeypatch.setattr(hf_export, "refusal", lambda cfg: None)
    ours = random_model(REFUSED["gates_sum_to_one"][0])
    ours.save_pretrained(tmp_path)
    theirs = transformers.SwitchTransformersForConditionalGeneration.from_pretrained(
        tmp_path).eval()
    got = np.asarray(ours(src, attention_mask=mask, decoder_input_ids=dec))
    assert np.abs(got - reference_logits(theirs, src, mask, dec)).max() > 1e-2


def test_an_upcycled_model_is_written_as_a_switchzoo_checkpoint_not_for_transformers(tmp_path,
                                                                                    capsys):
    """Upcycling renormalises gates, which transformers cannot compute: the output is a
    switchzoo checkpoint (no config.json or safetensors for transformers to misread), and
    saving the upcycled model in Hugging Face format is refused in one line."""
    dense = tmp_path / "t5"
    t5_checkpoint(dense, vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_decoder_layers=2,
                  feed_forward_proj="relu")
    assert upcycle.main(["--dense", str(dense), "--model", "switch_base_tiny", "--out",
                         str(tmp_path / "up")]) == 0
    out = tmp_path / "up"
    assert not (out / "config.json").exists() and not (out / hf.SINGLE).exists()
    origin = weights.resolve(out)
    assert origin.is_workdir and origin.cfg.moe.gates_sum_to_one
    with pytest.raises(hf.CheckpointError, match=r"^cannot save in Hugging Face format: "
                                                 r"moe.gates_sum_to_one[^\n]*$"):
        hf.save(tmp_path / "hf", origin.cfg, state_lib.abstract_model(origin.cfg)[1])


# ------------------------------------------------------------------ transformers' training loss

LOSS_CONFIGS = {
    # Two Switch layers per stack (blocks 1 and 3), random routers: transformers' aux loss is
    # one Switch eq. 4 per stack over its layers pooled, not its layers' mean (checked below to
    # differ) nor switchzoo's sum; its coefficients weigh each stack's term.
    "two_per_stack": dict(num_layers=4, num_decoder_layers=4, num_sparse_encoder_layers=2,
                          num_sparse_decoder_layers=2, router_z_loss_coef=0.01,
                          router_aux_loss_coef=0.1),
    # Two Switch layers in the encoder, one in the decoder: each stack's term has weight 1,
    # which no weighting of a mean over all three layers gives.
    "unequal_stacks": dict(num_layers=4, num_decoder_layers=2, num_sparse_encoder_layers=2,
                           num_sparse_decoder_layers=1, router_z_loss_coef=0.01,
                           router_aux_loss_coef=0.1),
    # One Switch layer per stack: the aux loss's own formula.
    "one_per_stack": dict(num_layers=2, num_decoder_layers=2, num_sparse_encoder_layers=1,
                          num_sparse_decoder_layers=1, router_z_loss_coef=0.01,
                          router_aux_loss_coef=0.01),
}


@pytest.fixture(scope="module", params=sorted(LOSS_CONFIGS))
def loss_checkpoint(request, tmp_path_factory):
    """A random SwitchTransformers checkpoint (transformers' own initialisation: routers far
    from uniform) of LOSS_CONFIGS[name]."""
    torch.manual_seed(0)
    Switch = transformers.SwitchTransformersForConditionalGeneration
    model = Switch(transformers.SwitchTransformersConfig(
        vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_heads=4, num_experts=4,
        expert_capacity=64, dropout_rate=0.0, router_jitter_noise=0.0, decoder_start_token_id=0,
        **LOSS_CONFIGS[request.param]))
    with torch.no_grad():
        model.encoder.embed_tokens.weight.copy_(model.shared.weight)
        model.decoder.embed_tokens.weight.copy_(model.shared.weight)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, model, path


def per_layer_aux_mean(router_logits) -> float:
    """The mean of the stack's Switch layers' own aux losses: what transformers does not
    compute where a stack has more than one."""
    balance = switch_transformers.load_balancing_loss_func
    return float(np.mean([balance(torch.softmax(l, -1), l.argmax(-1)) for l in router_logits]))


@pytest.mark.parametrize("scan_layers, dispatch", [(False, "auto"), (True, "index")])
def test_a_loaded_checkpoints_training_loss_is_transformers_loss(loss_checkpoint, scan_layers,
                                                                 dispatch):
    """The objective a run fine-tunes a Hugging Face checkpoint on (init_from: weights.resolve,
    steps.make_loss_fn, no label smoothing) on one batch without padding equals transformers'
    loss with output_router_logits=True: cross-entropy + its router z and aux losses at the
    checkpoint's coefficients, each stack's aux loss pooled over its Switch layers. Training
    mode on both sides (dropout 0, no jitter); unrolled layers with dropless dispatch (auto:
    the capacity holds every token) and scanned ones with capacity slots (index)."""
    name, model, path = loss_checkpoint
    rng = np.random.default_rng(3)
    src = rng.integers(2, 96, (3, 11))
    labels = rng.integers(2, 96, (3, 7))
    with torch.no_grad():
        out = model.train()(input_ids=torch.tensor(src), labels=torch.tensor(labels),
                            output_router_logits=True)
    assert float(out.encoder_z_loss) > 0 and float(out.decoder_z_loss) > 0
    if name == "two_per_stack":     # pooling is what is tested: the layers' mean is another
        for stack in ("encoder", "decoder"):
            pooled = float(getattr(out, f"{stack}_aux_loss"))
            assert abs(per_layer_aux_mean(getattr(out, f"{stack}_router_logits"))
                       - pooled) > 0.05, stack
    origin = weights.resolve(path)
    assert origin.cfg.moe.loss_reduction == "pooled"
    cfg = origin.cfg.replace(scan_layers=scan_layers,
                             moe=dataclasses.replace(origin.cfg.moe, dispatch=dispatch))
    setup = state_lib.setup(cfg, **ONE_DEVICE)
    batch = {"inputs": src.astype(np.int32), "targets": labels.astype(np.int32),
             "weights": np.ones(labels.shape, np.float32)}
    loss, metrics = jax.jit(steps.make_loss_fn(setup))(origin.load(setup), batch,
                                                       jax.random.key(0))
    print(f"{name} {dispatch}: switchzoo {float(loss):.6f}, transformers {out.loss.item():.6f}")
    np.testing.assert_allclose(float(metrics["aux_loss"]),
                               float(out.encoder_aux_loss + out.decoder_aux_loss), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["z_loss"]),
                               float(out.encoder_z_loss + out.decoder_z_loss), rtol=1e-5)
    assert abs(float(metrics["cross_entropy"]) - out.loss.item()) > 1e-3   # routing counts
    assert abs(float(loss) - out.loss.item()) < 1e-4


def test_a_model_routed_by_capacity_factors_is_refused_or_exported_with_fixed_slots(tmp_path):
    """The catalogue's settings (group size 32, evaluation capacity factor 2.0) have no Hugging
    Face form: refused in one line; with save_pretrained(expert_capacity=N) the export routes
    each sequence with N slots, and transformers computes what switchzoo computes from it, at
    an N that drops tokens (2 slots for up to 11 tokens over 4 experts)."""
    cfg = BASE.replace(moe=dataclasses.replace(MOE, expert_capacity=None, group_size=32,
                                               eval_capacity_factor=2.0))
    ours = random_model(cfg)
    with pytest.raises(hf.CheckpointError, match=r"^cannot save in Hugging Face format: "
                                                 r"moe.expert_capacity is unset[^\n]*$"):
        ours.save_pretrained(tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    ours.save_pretrained(tmp_path / "fixed", expert_capacity=2)
    theirs = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "fixed").eval()
    src, mask, dec = inputs(BASE.vocab_size)
    reread = switchzoo.from_pretrained(tmp_path / "fixed")
    assert reread.cfg.moe.expert_capacity == 2
    got = np.asarray(reread(src, attention_mask=mask, decoder_input_ids=dec))
    np.testing.assert_allclose(got, reference_logits(theirs, src, mask, dec), atol=1e-4)
