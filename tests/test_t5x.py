"""T5X checkpoints (switchzoo.t5x): a checkpoint T5X itself wrote loads with its
hyper-parameters read from its shapes; checkpoints written here in T5X's layout (msgpack
``checkpoint`` with optimizer/target, gzip zarr arrays, one bfloat16) from random transformers
models give transformers' logits; bad input is refused in one line."""
import pathlib
import re
import shutil

import numpy as np
import pytest
from flax import traverse_util

import switchzoo
from switchzoo import hf, t5x, weights

from conftest import Lazy
from test_hf import inputs, reference_logits

torch, transformers = Lazy("torch"), Lazy("transformers")

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "shared/fixtures/t5x"
TINY = FIXTURES / "test_t5_tiny"        # README.md beside it: written by T5X, arrays inline

# The test's own transformers -> flaxformer name map (not switchzoo.t5x's): (pattern over a
# transformers tensor name, flaxformer name template, transposed: Linear [out, in] -> [in, out]).
QKVO = {"q": "query", "k": "key", "v": "value", "o": "out"}
RULES = [
    (r"shared\.weight", "token_embedder/embedding", False),
    (r"lm_head\.weight", "decoder/logits_dense/kernel", True),
    (r"(encoder|decoder)\.final_layer_norm\.weight", r"\1/\1_norm/scale", False),
    (r"(encoder|decoder)\.block\.0\.layer\.0\.SelfAttention\.relative_attention_bias\.weight",
     r"\1/relpos_bias/rel_embedding", True),
    (r"encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.([qkvo])\.weight",
     r"encoder/layers_\1/attention/{\2}/kernel", True),
    (r"decoder\.block\.(\d+)\.layer\.0\.SelfAttention\.([qkvo])\.weight",
     r"decoder/layers_\1/self_attention/{\2}/kernel", True),
    (r"decoder\.block\.(\d+)\.layer\.1\.EncDecAttention\.([qkvo])\.weight",
     r"decoder/layers_\1/encoder_decoder_attention/{\2}/kernel", True),
    (r"encoder\.block\.(\d+)\.layer\.0\.layer_norm\.weight",
     r"encoder/layers_\1/pre_attention_layer_norm/scale", False),
    (r"encoder\.block\.(\d+)\.layer\.1\.layer_norm\.weight",
     r"encoder/layers_\1/pre_mlp_layer_norm/scale", False),
    (r"decoder\.block\.(\d+)\.layer\.0\.layer_norm\.weight",
     r"decoder/layers_\1/pre_self_attention_layer_norm/scale", False),
    (r"decoder\.block\.(\d+)\.layer\.1\.layer_norm\.weight",
     r"decoder/layers_\1/pre_cross_attention_layer_norm/scale", False),
    (r"decoder\.block\.(\d+)\.layer\.2\.layer_norm\.weight",
     r"decoder/layers_\1/pre_mlp_layer_norm/scale", False),
    (r"(encoder|decoder)\.block\.(\d+)\.layer\.\d\.(?:DenseReluDense|mlp)"
     r"\.(wi|wi_0|wi_1|wo)\.weight",
     r"\1/layers_\2/mlp/\3/kernel", True),
    (r"(encoder|decoder)\.block\.(\d+)\.layer\.\d\.mlp\.router\.classifier\.weight",
     r"\1/layers_\2/mlp/router/router_weights/w/kernel", True),
]
EXPERT = re.compile(r"(encoder|decoder)\.block\.(\d+)\.layer\.\d\.mlp\.experts\.expert_(\d+)"
                    r"\.(wi|wo)\.weight")


def flaxformer_name(name: str):
    """(flaxformer name, expert index or None, transposed) of a transformers tensor."""
    if m := EXPERT.fullmatch(name):
        return f"{m[1]}/layers_{m[2]}/mlp/expert/{m[4]}/kernel", int(m[3]), True
    for pattern, template, transposed in RULES:
        if m := re.fullmatch(pattern, name):
            return m.expand(template).format(**QKVO), None, transposed
    raise AssertionError(f"no flaxformer name for {name}")


def hf_parameters(model) -> dict:
    """The model's own tensors (named_parameters: tied copies once), as numpy float32."""
    return {n: p.detach().float().numpy() for n, p in model.named_parameters()
            if ".embed_tokens." not in n}


def to_flaxformer(tensors: dict, tied: bool) -> dict:
    """transformers tensors -> {flaxformer name: [in, out] array} (experts stacked first)."""
    out, experts = {}, {}
    for name, w in tensors.items():
        if tied and name == "lm_head.weight":
            continue
        ours, e, transposed = flaxformer_name(name)
        w = w.T if transposed else w
        if e is None:
            out[ours] = w
        else:
            experts.setdefault(ours, {})[e] = w
    for ours, ws in experts.items():
        out[ours] = np.stack([ws[e] for e in range(len(ws))])
    return out


def write_t5x(step: pathlib.Path, params: dict, in_zarr, bf16=()) -> pathlib.Path:
    """A T5X step directory as T5X lays it out: ``checkpoint`` (msgpack, version 3) with the
    model under optimizer/target, the ``in_zarr`` parameters as tensorstore specs pointing at
    gzip zarr arrays beside it (``bf16`` ones stored as bfloat16), the others inline."""
    import ml_dtypes
    import tensorstore as ts
    from flax import serialization
    step.mkdir(parents=True)
    target = {}
    for name, a in params.items():
        if name not in in_zarr:
            target[name] = np.asarray(a, np.float32)
            continue
        rel = "target." + name.replace("/", ".")
        dtype = "bfloat16" if name in bf16 else "float32"
        chunks = [max(1, a.shape[0] // 2), *a.shape[1:]]       # several chunks per array
        metadata = {"compressor": {"id": "gzip"}, "shape": list(a.shape), "chunks": chunks,
                    "dtype": "bfloat16" if name in bf16 else "<f4"}
        array = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(step / rel)},
                         "metadata": metadata}, create=True).result()
        stored = a.astype(ml_dtypes.bfloat16) if name in bf16 else a.astype(np.float32)
        assert name not in bf16 or np.array_equal(stored.astype(np.float32), a)   # pre-rounded
        array.write(stored).result()
        target[name] = {"driver": "zarr", "dtype": dtype,
                        "kvstore": {"driver": "file", "path": rel},
                        "metadata": {"chunks": np.array(chunks), "compressor": {"id": "gzip"},
                                     "shape": np.array(a.shape)}}
    state = {"param_states": {"token_embedder": {"embedding": {"v": np.zeros(1, np.float32)}}},
             "step": np.int32(100)}
    blob = serialization.msgpack_serialize(
        {"optimizer": {"state": state, "target": traverse_util.unflatten_dict(target, sep="/")},
         "version": 3})
    (step / "checkpoint").write_bytes(blob)
    return step


def round_to_bf16(model, names):
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in names:
                p.copy_(p.to(torch.bfloat16).to(torch.float32))


def untied_t5(**kw):
    """transformers' T5 v1.1 (gated GELU) with its own output layer: transformers 5 ties
    lm_head to the embedding even for T5 v1.1 (leaving the logits unscaled), so it is untied
    here by hand."""
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        feed_forward_proj="gated-gelu", tie_word_embeddings=False, **kw)).eval()
    model.lm_head.weight = torch.nn.Parameter(torch.randn(kw["vocab_size"], kw["d_model"]) / 4)
    assert not model.config.scale_decoder_outputs
    return model


# ------------------------------------------------------------------ a checkpoint T5X wrote


def test_a_checkpoint_t5x_wrote_loads_with_its_shapes_and_matches_transformers():
    step = TINY / "checkpoint_0"
    assert (step / "checkpoint").is_file(), f"fixture missing: {step}"
    ours = switchzoo.from_pretrained(step)
    c = ours.cfg
    assert (c.vocab_size, c.d_model, c.num_heads, c.d_kv, c.d_ff) == (32128, 8, 4, 3, 16)
    assert (c.num_encoder_layers, c.num_layers, c.activation) == (2, 2, "gated-gelu")
    assert (c.relpos_buckets, c.relpos_max_distance, c.tie_embeddings, c.moe) == \
        (32, 128, False, None)
    src, mask, dec = inputs(100)
    got = np.asarray(ours(src, attention_mask=mask, decoder_input_ids=dec))
    assert got.shape == (3, 6, 32128) and np.isfinite(got).all()

    # transformers' T5 v1.1 given the same weights (through the test's own name map)
    from flax import serialization
    stored = serialization.msgpack_restore((step / "checkpoint").read_bytes())
    target = {"/".join(k): v for k, v in _flat(stored["optimizer"]["target"])}
    model = untied_t5(vocab_size=32128, d_model=8, d_kv=3, d_ff=16, num_layers=2,
                      num_decoder_layers=2, num_heads=4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".embed_tokens." in name:
                continue
            theirs, _, transposed = flaxformer_name(name)
            w = np.asarray(target.pop(theirs), np.float32)
            p.copy_(torch.tensor(np.array(w.T if transposed else w)))
    assert not target, f"fixture parameters not mapped: {sorted(target)}"
    np.testing.assert_allclose(got, reference_logits(model, src, mask, dec), atol=1e-4)


def _flat(tree, prefix=()):
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from _flat(v, prefix + (k,))
        else:
            yield prefix + (k,), v


def test_a_directory_of_steps_resolves_to_the_highest_complete_step(tmp_path):
    for n in (20, 100):
        (tmp_path / f"checkpoint_{n}").mkdir()
        shutil.copy(TINY / "checkpoint_0" / "checkpoint", tmp_path / f"checkpoint_{n}")
    (tmp_path / "checkpoint_300").mkdir()                    # being written: no file yet
    assert t5x.step_dir(tmp_path) == tmp_path / "checkpoint_100"       # 100 > 20, numerically
    origin = weights.resolve(tmp_path)
    assert origin.hf is not None and origin.cfg == weights.resolve(TINY).cfg
    assert origin.cfg.d_model == 8 and origin.cfg.moe is None


# -------------------------------------------------- written here from transformers models


SWITCH = dict(vocab_size=96, d_model=24, d_kv=8, d_ff=40, num_layers=2, num_decoder_layers=2,
              num_heads=4, num_experts=4, num_sparse_encoder_layers=1,
              num_sparse_decoder_layers=2, expert_capacity=64, tie_word_embeddings=True)
# stored as bfloat16: the decoder's last Switch layer's experts (rounded first, in transformers)
SWITCH_BF16 = "decoder/layers_1/mlp/expert/wi/kernel"


@pytest.fixture(scope="module")
def switch(tmp_path_factory):
    """A Switch classic-like T5X checkpoint (ReLU experts, tied output layer) of a random
    transformers SwitchTransformers model, and that model."""
    torch.manual_seed(0)
    model = transformers.SwitchTransformersForConditionalGeneration(
        transformers.SwitchTransformersConfig(**SWITCH)).eval()
    round_to_bf16(model, {f"decoder.block.1.layer.2.mlp.experts.expert_{e}.wi.weight"
                          for e in range(SWITCH["num_experts"])})
    params = to_flaxformer(hf_parameters(model), tied=True)
    big = {n for n in params if n.endswith(("kernel", "embedding"))}
    step = write_t5x(tmp_path_factory.mktemp("switch") / "checkpoint_100", params, big,
                     bf16={SWITCH_BF16})
    return step, model


def test_switch_logits_match_transformers(switch, tmp_path):
    step, model = switch
    assert '"dtype":"bfloat16"' in (step / ("target." + SWITCH_BF16.replace("/", "."))
                                    / ".zarray").read_text()
    ours = switchzoo.from_pretrained(step.parent)                    # the steps' directory
    c = ours.cfg
    assert (c.d_model, c.num_heads, c.d_kv, c.d_ff, c.vocab_size) == (24, 4, 8, 40, 96)
    assert (c.activation, c.tie_embeddings, c.moe.num_experts) == ("relu", True, 4)
    assert (c.moe.encoder_sparse_layers, c.moe.sparse_layers) == ((1,), (0, 1))
    assert ours.facts["dtypes"]["decoder/layers/1/ffn/wi"] == "bfloat16"
    src, mask, dec = inputs(SWITCH["vocab_size"])
    got = np.asarray(ours(src, attention_mask=mask, decoder_input_ids=dec))
    diff = np.abs(got - reference_logits(model, src, mask, dec)).max()
    print(f"switch: max abs logit difference {diff:.2e}")
    assert diff < 1e-4
    # saved in Hugging Face format, transformers reads the T5X checkpoint's model
    ours.save_pretrained(tmp_path)
    back = transformers.SwitchTransformersForConditionalGeneration.from_pretrained(
        tmp_path, dtype=torch.float32).eval()
    np.testing.assert_allclose(reference_logits(back, src, mask, dec),
                               reference_logits(model, src, mask, dec), atol=1e-6)


def test_t5_v1_1_logits_match_transformers(tmp_path):
    model = untied_t5(vocab_size=80, d_model=24, d_kv=8, d_ff=40, num_layers=2,
                      num_decoder_layers=3, num_heads=4)
    round_to_bf16(model, {"shared.weight"})
    params = to_flaxformer(hf_parameters(model), tied=False)
    assert "decoder/logits_dense/kernel" in params and "encoder/layers_1/mlp/wi_1/kernel" in params
    big = {n for n in params if n.endswith(("kernel", "embedding"))} - {
        "decoder/layers_0/self_attention/query/kernel"}                  # one kernel inline
    step = write_t5x(tmp_path / "checkpoint_7", params, big, bf16={"token_embedder/embedding"})
    ours = switchzoo.from_pretrained(step)
    c = ours.cfg
    assert (c.num_encoder_layers, c.num_layers, c.activation, c.tie_embeddings, c.moe) == \
        (2, 3, "gated-gelu", False, None)
    src, mask, dec = inputs(80)
    got = np.asarray(ours(src, attention_mask=mask, decoder_input_ids=dec))
    diff = np.abs(got - reference_logits(model, src, mask, dec)).max()
    print(f"t5 v1.1: max abs logit difference {diff:.2e}")
    assert diff < 1e-4


# ------------------------------------------------------------------------------ bad input


def one_line(excinfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text, text
    return text


def edited_fixture(tmp_path, change) -> pathlib.Path:
    """A copy of the T5X-written step with its optimizer/target changed by ``change``."""
    from flax import serialization
    stored = serialization.msgpack_restore((TINY / "checkpoint_0" / "checkpoint").read_bytes())
    change(stored["optimizer"]["target"])
    step = tmp_path / "checkpoint_0"
    step.mkdir()
    (step / "checkpoint").write_bytes(serialization.msgpack_serialize(stored))
    return step


def test_a_directory_that_is_neither_is_refused(tmp_path):
    for load in (switchzoo.from_pretrained, weights.resolve):
        with pytest.raises(hf.CheckpointError, match=r"has no config\.json.* not a T5X "
                                                     r"checkpoint; pass") as e:
            load(tmp_path)
        assert str(tmp_path) in one_line(e)
    with pytest.raises(hf.CheckpointError, match=r"nope is not a directory; pass .* or a T5X"):
        switchzoo.from_pretrained(tmp_path / "nope")
    (tmp_path / "checkpoint_5").mkdir()                      # a step T5X never finished
    with pytest.raises(FileNotFoundError, match=r"checkpoint_5\) hold no checkpoint file") as e:
        switchzoo.from_pretrained(tmp_path)
    one_line(e)


def test_a_damaged_msgpack_file_is_refused(tmp_path):
    step = tmp_path / "checkpoint_0"
    step.mkdir()
    data = (TINY / "checkpoint_0" / "checkpoint").read_bytes()
    (step / "checkpoint").write_bytes(data[:len(data) // 3])
    with pytest.raises(ValueError, match=r"checkpoint_0/checkpoint is not a readable T5X "
                                         r"checkpoint .*damaged or truncated: copy") as e:
        switchzoo.from_pretrained(step)
    one_line(e)
    (step / "checkpoint").write_bytes(b'model_checkpoint_path: "model.ckpt-1000000"\n')
    with pytest.raises(ValueError, match="is a TensorFlow checkpoint's index") as e:
        weights.resolve(step)
    one_line(e)


def test_a_missing_zarr_array_or_chunk_is_refused(switch, tmp_path):
    step, _ = switch
    lost = "target.encoder.layers_1.mlp.expert.wo.kernel"
    copy = tmp_path / "no_array" / step.name
    shutil.copytree(step, copy)
    shutil.rmtree(copy / lost)
    with pytest.raises(FileNotFoundError, match=rf"{re.escape(lost)} is missing .*keeps T5X "
                                                r"parameter encoder/layers_1/mlp/expert/wo/"
                                                r"kernel .*copy the checkpoint_N") as e:
        switchzoo.from_pretrained(copy)
    one_line(e)
    copy = tmp_path / "no_chunk" / step.name                # zarr would read zeros; not here
    shutil.copytree(step, copy)
    (copy / lost / "1.0.0").unlink()
    with pytest.raises(ValueError, match=r"cannot read T5X parameter encoder/layers_1/mlp/expert"
                                         r"/wo/kernel .*is missing") as e:
        switchzoo.from_pretrained(copy)
    one_line(e)


@pytest.mark.parametrize("change, message", [
    (lambda t: t["encoder"]["layers_0"]["attention"]["query"].update(bias=np.zeros(12)),
     r"holds T5X parameters switchzoo does not map .*: encoder/layers_0/attention/query/bias;"),
    (lambda t: t["decoder"]["layers_1"].pop("pre_cross_attention_layer_norm"),
     r"lacks T5X parameters .*: decoder/layers_1/pre_cross_attention_layer_norm/scale;"),
    (lambda t: t["decoder"]["layers_1"]["mlp"]["wo"].update(kernel=np.zeros((20, 8))),
     r"unexpected shape .*decoder/layers_1/mlp/wo/kernel \(20, 8\) \(expected \(16, 8\)\)"),
])
def test_parameters_that_do_not_fit_are_refused(tmp_path, change, message):
    step = edited_fixture(tmp_path, change)
    with pytest.raises(ValueError, match=message) as e:
        switchzoo.from_pretrained(step)
    assert str(step / "checkpoint") in one_line(e)
