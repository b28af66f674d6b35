"""Hugging Face SwitchTransformers checkpoints: parity with transformers' logits, a bit-identical
round trip, sharded placement, and clear errors for checkpoints that do not match."""
import dataclasses
import json
import shutil

import jax
import numpy as np
import pytest

import switchzoo
from switchzoo import hf, tensorfile

from conftest import Lazy

torch, transformers = Lazy("torch"), Lazy("transformers")

CONFIGS = {
    # encoder deeper than decoder, tied embeddings, 4 experts, sparse every 2nd / 3rd block
    "tied_e4": dict(vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=3,
                    num_decoder_layers=2, num_heads=4, num_experts=4,
                    num_sparse_encoder_layers=1, num_sparse_decoder_layers=1,
                    tie_word_embeddings=True),
    # decoder deeper than encoder, untied head, 8 experts, every block sparse, 2 wide heads
    "untied_e8": dict(vocab_size=80, d_model=24, d_kv=16, d_ff=40, num_layers=2,
                      num_decoder_layers=3, num_heads=2, num_experts=8,
                      num_sparse_encoder_layers=2, num_sparse_decoder_layers=3,
                      tie_word_embeddings=False),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.SwitchTransformersConfig(expert_capacity=64, **CONFIGS[request.param])
    model = transformers.SwitchTransformersForConditionalGeneration(cfg).eval()
    with torch.no_grad():     # one input embedding, as in the published checkpoints
        model.encoder.embed_tokens.weight.copy_(model.shared.weight)
        model.decoder.embed_tokens.weight.copy_(model.shared.weight)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, model, path


def inputs(vocab):
    rng = np.random.default_rng(0)
    src = rng.integers(2, vocab, (3, 11))
    mask = np.ones_like(src)
    mask[0, 7:] = 0
    mask[2, 9:] = 0
    src = src * mask                                 # padding is the pad id 0
    dec = rng.integers(2, vocab, (3, 6))
    dec[:, 0] = 0
    return src, mask, dec


def reference_logits(model, src, mask, dec):
    with torch.no_grad():
        return model(input_ids=torch.tensor(src), attention_mask=torch.tensor(mask),
                     decoder_input_ids=torch.tensor(dec)).logits.numpy()


def test_logits_match_transformers(checkpoint):
    name, model, path = checkpoint
    src, mask, dec = inputs(model.config.vocab_size)
    ours = switchzoo.from_pretrained(path)
    got = np.asarray(ours(src, attention_mask=mask, decoder_input_ids=dec))
    diff = np.abs(got - reference_logits(model, src, mask, dec)).max()
    print(f"{name}: max abs logit difference {diff:.2e}")
    assert diff < 1e-4


def test_sparse_layers_come_from_the_weights(checkpoint):
    name, model, path = checkpoint
    cfg = switchzoo.from_pretrained(path).cfg
    want = {"tied_e4": ((1,), (1,)), "untied_e8": ((0, 1), (0, 1, 2))}[name]
    assert (cfg.moe.encoder_sparse_layers, cfg.moe.sparse_layers) == want


def test_sharded_load_gives_the_same_logits(checkpoint):
    name, model, path = checkpoint
    src, mask, dec = inputs(model.config.vocab_size)
    ours = switchzoo.from_pretrained(path, mesh="data:2,model:2,expert:2", layout="dp_mp_ep")
    wi = ours.params["decoder"]["layers"][1]["ffn"]["wi"]
    assert wi.sharding.spec == jax.sharding.PartitionSpec("expert", None, "model")
    assert wi.addressable_shards[0].data.shape[0] == model.config.num_experts // 2
    got = np.asarray(ours(src, attention_mask=mask, decoder_input_ids=dec))
    np.testing.assert_allclose(got, reference_logits(model, src, mask, dec), atol=1e-4)


def test_round_trip_is_bit_identical_and_transformers_reads_it(checkpoint, tmp_path):
    name, model, path = checkpoint
    switchzoo.from_pretrained(path).save_pretrained(tmp_path)
    a = tensorfile.TensorFile(path / hf.SINGLE)
    b = tensorfile.TensorFile(tmp_path / hf.SINGLE)
    assert sorted(a.names()) == sorted(b.names())
    for n in a.names():
        assert a.get(n).dtype == b.get(n).dtype and a.get(n).tobytes() == b.get(n).tobytes(), n
    assert json.loads((tmp_path / "config.json").read_text()) == \
        json.loads((path / "config.json").read_text())
    back = transformers.SwitchTransformersForConditionalGeneration.from_pretrained(tmp_path).eval()
    src, mask, dec = inputs(model.config.vocab_size)
    np.testing.assert_array_equal(reference_logits(back, src, mask, dec),
                                  reference_logits(model, src, mask, dec))


def test_sharded_safetensors_index_loads(checkpoint, tmp_path):
    name, model, path = checkpoint
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / hf.INDEX).is_file()
    src, mask, dec = inputs(model.config.vocab_size)
    got = np.asarray(switchzoo.from_pretrained(tmp_path)(src, attention_mask=mask,
                                                         decoder_input_ids=dec))
    np.testing.assert_allclose(got, reference_logits(model, src, mask, dec), atol=1e-4)


def edit(path, tmp_path, change):
    """A copy of the checkpoint with its tensors changed by ``change(dict) -> dict``."""
    out = tmp_path / "edited"
    shutil.copytree(path, out)
    f = tensorfile.TensorFile(path / hf.SINGLE)
    tensors = change({n: np.array(f.get(n)) for n in f.names()})
    tensorfile.write_arrays(out / hf.SINGLE, tensors, {"format": "pt"})
    return out


@pytest.mark.parametrize("change, message", [
    (lambda t: {k: v for k, v in t.items() if "expert_3.wi" not in k}, r"missing tensors: .*expert_3\.wi"),
    (lambda t: {**t, "decoder.block.0.layer.9.mlp.wi.weight": np.zeros((2, 2), np.float32)},
     r"unexpected tensors .*refusing to drop them\): decoder\.block\.0\.layer\.9"),
    (lambda t: {**t, "shared.weight": t["shared.weight"][:, :-1]}, r"mis-shaped tensors: shared\.weight"),
    (lambda t: {**t, "encoder.embed_tokens.weight": t["shared.weight"] + 1},
     r"encoder\.embed_tokens\.weight differs from shared\.weight"),
])
def test_checkpoints_that_do_not_match_their_config_are_refused(checkpoint, tmp_path, change,
                                                               message):
    _, _, path = checkpoint
    with pytest.raises(hf.CheckpointError, match=message):
        switchzoo.from_pretrained(edit(path, tmp_path, change))


def test_directories_that_are_not_checkpoints_are_refused(checkpoint, tmp_path):
    _, _, path = checkpoint
    with pytest.raises(hf.CheckpointError, match="has no config.json"):
        switchzoo.from_pretrained(tmp_path)
    with pytest.raises(hf.CheckpointError, match="is not a directory"):
        switchzoo.from_pretrained(tmp_path / "nope")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(path / "config.json", pickled)
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04not loaded")
    with pytest.raises(hf.CheckpointError, match="pickle files are never loaded"):
        switchzoo.from_pretrained(pickled)
    truncated = tmp_path / "truncated"
    shutil.copytree(path, truncated)
    data = (truncated / hf.SINGLE).read_bytes()
    (truncated / hf.SINGLE).write_bytes(data[:len(data) // 2])
    with pytest.raises(hf.CheckpointError, match="truncated or corrupted"):
        switchzoo.from_pretrained(truncated)


def test_a_fresh_model_saves_in_a_format_transformers_reads(tmp_path):
    cfg = switchzoo.zoo.get("switch_base_tiny")
    # Route per sequence with a fixed capacity, as transformers does, large enough to drop nothing.
    cfg = cfg.replace(moe=dataclasses.replace(cfg.moe, group_size=0, expert_capacity=64))
    ours = switchzoo.init(cfg, seed=1)
    ours.save_pretrained(tmp_path)
    theirs = transformers.SwitchTransformersForConditionalGeneration.from_pretrained(
        tmp_path).eval()
    src, mask, dec = inputs(cfg.vocab_size)
    got = np.asarray(ours(src, attention_mask=mask, decoder_input_ids=dec))
    np.testing.assert_allclose(got, reference_logits(theirs, src, mask, dec), atol=1e-4)


T5_CONFIGS = {
    # T5 v1.0: ReLU, the output layer tied to the embedding with the d_model**-0.5 logit scale
    "t5_relu": dict(feed_forward_proj="relu"),
    # T5 v1.1's gated GELU blocks (wi_0, wi_1); tied, as transformers 5 still scales that way
    "t5_gated": dict(feed_forward_proj="gated-gelu"),
}


def t5_checkpoint(path, **kw):
    """A random Hugging Face T5 saved at ``path`` (``kw`` over small defaults)."""
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**{
        **dict(vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=1,
               num_heads=4), **kw})).eval()
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize("name", sorted(T5_CONFIGS))
def test_t5_logits_match_transformers(name, tmp_path):
    model = t5_checkpoint(tmp_path, **T5_CONFIGS[name])
    ours = switchzoo.from_pretrained(tmp_path)
    assert ours.cfg.moe is None and ours.cfg.tie_embeddings
    assert ours.cfg.activation == T5_CONFIGS[name]["feed_forward_proj"]
    src, mask, dec = inputs(model.config.vocab_size)
    got = np.asarray(ours(src, attention_mask=mask, decoder_input_ids=dec))
    diff = np.abs(got - reference_logits(model, src, mask, dec)).max()
    print(f"{name}: max abs logit difference {diff:.2e}")
    assert diff < 1e-4


def test_t5_output_layers_switchzoo_cannot_compute_are_refused(tmp_path):
    t5_checkpoint(tmp_path / "unscaled", tie_word_embeddings=False)   # tied, unscaled in v5
    with pytest.raises(hf.CheckpointError, match=r"without the d_model\*\*-0.5 logit scale"):
        switchzoo.from_pretrained(tmp_path / "unscaled")
    t5_checkpoint(tmp_path / "silu", feed_forward_proj="gated-silu")
    with pytest.raises(hf.CheckpointError, match="feed_forward_proj 'gated-silu'"):
        switchzoo.from_pretrained(tmp_path / "silu")
