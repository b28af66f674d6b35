"""T5X checkpoints (the format of the official Switch and T5 v1.1 checkpoints,
gs://t5-data/pretrained_models/t5x/...) read as a Hugging Face directory: Hugging Face-named
tensors and a config.json-like dict, so that switchzoo.hf places them (``read_config`` returns an
hf.Pretrained; hf.load_params loads it, weights.resolve and switchzoo.from_pretrained dispatch
here through ``read_any``).

A T5X step directory ``checkpoint_N/`` holds the msgpack file ``checkpoint`` (flax.serialization,
T5X format version 3). The model is its ``optimizer/target`` tree (``optimizer/state``, the
optimizer's, is not read). Each leaf is an array inline (flax's msgpack extension) or, for large
arrays, a tensorstore spec (driver zarr, ``kvstore.path`` relative to the step directory; older
writers put ``path`` beside ``kvstore``) whose array is that directory (gzip chunks; float32 or
bfloat16). Zarr arrays are opened, not read, until a tensor is asked for; an expert's tensor
reads that expert's slice only. A chunk file missing from an array directory is an error, never
zeros.

Names (flaxformer's T5 / MoE architectures and T5X's minimal T5; ``{i}`` a layer, kernels are
[in, out] where Hugging Face Linear weights are [out, in], so every kernel is transposed):

    token_embedder/embedding                       shared.weight
    decoder/logits_dense/kernel                    lm_head.weight                 (untied only)
    {s}/relpos_bias/rel_embedding [heads, buckets] {s}.block.0.layer.0.SelfAttention
                                                     .relative_attention_bias.weight (transposed)
    encoder/encoder_norm/scale                     encoder.final_layer_norm.weight
    decoder/decoder_norm/scale                     decoder.final_layer_norm.weight
    encoder/layers_{i}/attention/{query,key,value,out}/kernel
                                                   encoder.block.{i}.layer.0.SelfAttention.{q,k,v,o}
    encoder/layers_{i}/pre_attention_layer_norm    encoder.block.{i}.layer.0.layer_norm
    encoder/layers_{i}/pre_mlp_layer_norm          encoder.block.{i}.layer.1.layer_norm
    decoder/layers_{i}/self_attention/...          decoder.block.{i}.layer.0.SelfAttention...
    decoder/layers_{i}/pre_self_attention_layer_norm  decoder.block.{i}.layer.0.layer_norm
    decoder/layers_{i}/encoder_decoder_attention/...  decoder.block.{i}.layer.1.EncDecAttention...
    decoder/layers_{i}/pre_cross_attention_layer_norm decoder.block.{i}.layer.1.layer_norm
    decoder/layers_{i}/pre_mlp_layer_norm          decoder.block.{i}.layer.2.layer_norm
    {s}/layers_{i}/mlp/{wi,wi_0,wi_1,wo}/kernel    {s}.block.{i}.layer.{1|2}
                                                     .{DenseReluDense|mlp}.{w}
    {s}/layers_{i}/mlp/router/router_weights/w/kernel [d_model, E]
                                                   {s}.block.{i}.layer.{1|2}.mlp.router.classifier
    {s}/layers_{i}/mlp/expert/{wi,wo}/kernel [E, in, out]
                                                   {s}.block.{i}.layer.{1|2}.mlp.experts
                                                     .expert_{e}.{wi,wo}        (one per expert)

(norms' ``/scale`` -> ``.weight``; dense blocks are ``DenseReluDense`` in a dense model, as in
transformers' T5, and ``mlp`` in a Switch model, as in its SwitchTransformers.) Attention kernels
stored split by head ([d_model, heads, d_kv], out [heads, d_kv, d_model]) are read too. Any other
name under optimizer/target (a per-layer relpos_bias, fused or biased kernels, ...) is refused.

What the shapes decide: vocab_size and d_model (the embedding), num_heads and
relative_attention_num_buckets (encoder/relpos_bias/rel_embedding), d_kv (the query kernel's
width / heads), d_ff (a dense block's wi, else an expert's), the layers of each stack (the
highest layers_N), num_experts (the router kernel), which layers are Switch layers (those with
mlp/router), gated (wi_0 + wi_1: T5 v1.1's gated GELU, flaxformer's default activations
('gelu', 'linear'); tanh GELU, transformers' gelu_new) or not (wi: ReLU, T5 v1.0 and the Switch
classic checkpoints), and tied (no decoder/logits_dense: logits from the embedding scaled by
d_model**-0.5, as flaxformer and T5X compute them) or untied.

What the shapes cannot tell takes transformers' T5Config / SwitchTransformersConfig defaults,
the values of Hugging Face's own conversions of these checkpoints (google/switch-base-8,
google/t5-v1_1-*): relative_attention_max_distance 128, dropout_rate 0.1, layer_norm_epsilon
1e-6, pad 0 / eos 1 / decoder start 0; for a Switch model expert_capacity 64 (tokens per expert
per sequence, as transformers routes: a run-time setting, which a run's own moe config replaces),
router_jitter_noise 0.01, router_aux_loss_coef and router_z_loss_coef 0.001 (training only), no
router bias. No gin file is read. Gated (wi_0/wi_1) experts, which transformers'
SwitchTransformers cannot compute, are refused.
"""
from __future__ import annotations

import pathlib
import re

import numpy as np

from switchzoo import errors, hf
from switchzoo.hf_tensors import DENSE_MLP, CheckpointError
from switchzoo.t5x_file import (CHECKPOINT, COPY_AGAIN, Inline, Tensors, Zarr, is_spec,
                                parameters)


STEP = re.compile(r"^checkpoint_(\d+)$")
LAYER = re.compile(r"^(encoder|decoder)/layers_(\d+)/")
LIST_AT_MOST = 8
# transformers' defaults for what the weights cannot tell (module doc).
T5_DEFAULTS = {"relative_attention_max_distance": 128, "dropout_rate": 0.1,
               "layer_norm_epsilon": 1e-6, "is_encoder_decoder": True, "pad_token_id": 0,
               "eos_token_id": 1, "decoder_start_token_id": 0}
SWITCH_DEFAULTS = {"expert_capacity": 64, "router_bias": False, "router_jitter_noise": 0.01,
                   "router_dtype": "float32", "router_aux_loss_coef": 0.001,
                   "router_z_loss_coef": 0.001, "dense_act_fn": "relu"}
ATTENTION = {"encoder": (("attention", 0, "SelfAttention"),),
             "decoder": (("self_attention", 0, "SelfAttention"),
                         ("encoder_decoder_attention", 1, "EncDecAttention"))}
NORMS = {"encoder": (("pre_attention_layer_norm", 0), ("pre_mlp_layer_norm", 1)),
         "decoder": (("pre_self_attention_layer_norm", 0), ("pre_cross_attention_layer_norm", 1),
                     ("pre_mlp_layer_norm", 2))}
PROJECTIONS = (("query", "q"), ("key", "k"), ("value", "v"), ("out", "o"))


# ------------------------------------------------------------------------------------ finding


def _steps(path: pathlib.Path) -> list[tuple[int, pathlib.Path]]:
    return sorted((int(m.group(1)), p) for p in path.iterdir()
                  if (m := STEP.match(p.name)) and p.is_dir())


def is_checkpoint(path) -> bool:
    """Whether ``path`` is a T5X step directory (it holds ``checkpoint``) or a T5X checkpoints
    directory (it holds checkpoint_N directories), or a step's ``checkpoint`` file itself."""
    path = pathlib.Path(path).expanduser()
    if path.is_file():
        return path.name == CHECKPOINT and STEP.match(path.parent.name) is not None
    return path.is_dir() and ((path / CHECKPOINT).is_file() or bool(_steps(path)))


def step_dir(path) -> pathlib.Path:
    """The step directory ``path`` names: itself, the parent of its ``checkpoint`` file, or the
    highest checkpoint_N under it that holds a ``checkpoint`` file."""
    path = pathlib.Path(path).expanduser()
    if path.is_file() and path.name == CHECKPOINT:
        return path.parent
    if (path / CHECKPOINT).is_file():
        return path
    steps = _steps(path) if path.is_dir() else []
    complete = [p for _, p in steps if (p / CHECKPOINT).is_file()]
    if not complete:
        where = (f"its checkpoint_N directories ({', '.join(p.name for _, p in steps[-3:])}) "
                 "hold no checkpoint file" if steps else "it holds no checkpoint file and no "
                 "checkpoint_N directories")
        raise FileNotFoundError(f"{path} is not a T5X checkpoint: {where}; pass a T5X step "
                                "directory (checkpoint_N/ with its checkpoint file and array "
                                "directories) or the directory holding them")
    return complete[-1]


def read_any(path) -> hf.Pretrained:
    """hf.read_config of a Hugging Face directory, or ``read_config`` of a T5X checkpoint: the
    dispatch of weights.resolve and switchzoo.from_pretrained."""
    path = pathlib.Path(path).expanduser()
    if is_checkpoint(path) and not (path / "config.json").is_file():
        return read_config(path)
    if not (path / "config.json").is_file():
        what = (f"has no config.json, so it is not a Hugging Face model directory, and no "
                f"{CHECKPOINT} file or checkpoint_N directories, so it is not a T5X checkpoint"
                if path.is_dir() else "is not a directory")
        raise CheckpointError(f"{path} {what}; pass the folder holding config.json and the "
                              "weights (model.safetensors), or a T5X step directory "
                              "(checkpoint_N/ with its checkpoint file)")
    return hf.read_config(path)


# ------------------------------------------------------------------------------------ reading


# ------------------------------------------------------------------------------------- layout


def _listing(names) -> str:
    names = sorted(names)
    more = f" and {len(names) - LIST_AT_MOST} more" if len(names) > LIST_AT_MOST else ""
    return ", ".join(names[:LIST_AT_MOST]) + more


def _first(leaves: dict, pattern: str):
    """The leaf of the first name (in layer order) matching ``pattern``, or None."""
    rx = re.compile(pattern)
    hits = sorted((int(m.group(1)) if m.groups() else 0, n) for n in leaves
                  if (m := rx.fullmatch(n)))
    return leaves[hits[0][1]] if hits else None


def _hyper(file: pathlib.Path, leaves: dict) -> dict:
    """The hyper-parameters the shapes give (module doc)."""
    def need(name):
        if name not in leaves:
            raise ValueError(f"{file} has no T5X parameter {name} under optimizer/target, so it "
                             "is not a T5 / Switch encoder-decoder T5X checkpoint (flaxformer or "
                             f"T5X names); {COPY_AGAIN}, or pass a T5 / Switch checkpoint")
        return leaves[name].shape
    vocab, d_model = need("token_embedder/embedding")
    heads, buckets = need("encoder/relpos_bias/rel_embedding")
    query = need("encoder/layers_0/attention/query/kernel")
    d_kv = query[2] if len(query) == 3 else query[-1] // heads
    layers = {s: 1 + max((int(m.group(2)) for n in leaves if (m := LAYER.match(n))
                          and m.group(1) == s), default=-1) for s in ("encoder", "decoder")}
    sparse = {s: tuple(sorted({int(m.group(2)) for n in leaves if (m := LAYER.match(n))
                               and m.group(1) == s and "/mlp/router/" in n}))
              for s in ("encoder", "decoder")}
    gated = any(re.search(r"/mlp/(expert/)?wi_[01]/kernel$", n) for n in leaves)
    dense = _first(leaves, r"(?:encoder|decoder)/layers_(\d+)/mlp/wi(?:_0)?/kernel")
    expert = _first(leaves, r"(?:encoder|decoder)/layers_(\d+)/mlp/expert/wi(?:_0)?/kernel")
    router = _first(leaves, r"(?:encoder|decoder)/layers_(\d+)/mlp/router/router_weights/w/kernel")
    if dense is None and expert is None:
        raise ValueError(f"{file} has no feed-forward kernels (mlp/wi/kernel, mlp/wi_0/kernel or "
                         f"mlp/expert/wi/kernel) under optimizer/target; {COPY_AGAIN}")
    return {"vocab": vocab, "d_model": d_model, "heads": heads, "buckets": buckets, "d_kv": d_kv,
            "d_ff": dense.shape[-1] if dense is not None else expert.shape[-1],
            "experts": router.shape[-1] if router is not None else
            (expert.shape[0] if expert is not None else 0),
            "layers": layers, "sparse": sparse, "gated": gated,
            "tied": "decoder/logits_dense/kernel" not in leaves}


def _expected(hp: dict) -> dict:
    """{T5X name: (HF name or per-expert name pattern, its shape, kernel: whether it is an
    [in, out] kernel, transposed to Hugging Face's [out, in])} for the hyper-parameters."""
    D, H, K, F, E = hp["d_model"], hp["heads"], hp["d_kv"], hp["d_ff"], hp["experts"]
    dense_mlp = DENSE_MLP["switch_transformers" if E else "t5"]
    wis = ("wi_0", "wi_1") if hp["gated"] else ("wi",)
    out = {"token_embedder/embedding": ("shared.weight", (hp["vocab"], D), False)}
    if not hp["tied"]:
        out["decoder/logits_dense/kernel"] = ("lm_head.weight", (D, hp["vocab"]), True)
    for s in ("encoder", "decoder"):
        out[f"{s}/relpos_bias/rel_embedding"] = (
            f"{s}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            (H, hp["buckets"]), True)
        out[f"{s}/{s}_norm/scale"] = (f"{s}.final_layer_norm.weight", (D,), False)
        ffn_at = len(NORMS[s]) - 1
        for i in range(hp["layers"][s]):
            mine, theirs = f"{s}/layers_{i}", f"{s}.block.{i}.layer"
            for part, j, module in ATTENTION[s]:
                for w, hf_w in PROJECTIONS:
                    out[f"{mine}/{part}/{w}/kernel"] = (
                        f"{theirs}.{j}.{module}.{hf_w}.weight",
                        (H * K, D) if w == "out" else (D, H * K), True)
            for norm, j in NORMS[s]:
                out[f"{mine}/{norm}/scale"] = (f"{theirs}.{j}.layer_norm.weight", (D,), False)
            mlp = f"{theirs}.{ffn_at}"
            if i in hp["sparse"][s]:
                out[f"{mine}/mlp/router/router_weights/w/kernel"] = (
                    f"{mlp}.mlp.router.classifier.weight", (D, E), True)
                for w in wis + ("wo",):
                    out[f"{mine}/mlp/expert/{w}/kernel"] = (
                        f"{mlp}.mlp.experts.expert_{{}}.{w}.weight",
                        (E, F, D) if w == "wo" else (E, D, F), True)
            else:
                for w in wis + ("wo",):
                    out[f"{mine}/mlp/{w}/kernel"] = (f"{mlp}.{dense_mlp}.{w}.weight",
                                                     (F, D) if w == "wo" else (D, F), True)
    return out


def _split_heads(name: str, shape, hp) -> tuple | None:
    """The head-split form of an attention kernel's 2-D shape (flaxformer's split_head_kernel)."""
    if re.search(r"/(query|key|value)/kernel$", name):
        return (shape[0], hp["heads"], hp["d_kv"])
    if re.search(r"attention/out/kernel$", name):
        return (hp["heads"], hp["d_kv"], shape[1])
    return None


def read_config(path) -> hf.Pretrained:
    """A T5X checkpoint (a step directory, or the directory of checkpoint_N directories: the
    highest N) as hf.read_config gives a Hugging Face directory: config (from the shapes; module
    doc) and {HF tensor name: Tensors}. Reads the msgpack file and opens the zarr arrays; reads
    no zarr data."""
    step = step_dir(path)
    file = step / CHECKPOINT
    raw = parameters(step)
    leaves = {}
    for name, value in raw.items():
        if is_spec(value):
            leaves[name] = Zarr(step, name, value)
        elif isinstance(value, np.ndarray) or hasattr(value, "__array__"):
            leaves[name] = Inline(np.asarray(value))
        else:
            raise ValueError(f"{file}: parameter {name} is a {type(value).__name__}, neither an "
                             f"array nor a tensorstore spec; {COPY_AGAIN}")
    hp = _hyper(file, leaves)
    expected = _expected(hp)
    unknown = set(leaves) - set(expected)
    if unknown:
        raise ValueError(f"{file} holds T5X parameters switchzoo does not map to a T5 / Switch "
                         f"layer: {_listing(unknown)}; only flaxformer's T5 v1.0/v1.1 and Switch "
                         "(ReLU experts) names are read (switchzoo/t5x.py's doc lists them)")
    missing = set(expected) - set(leaves)
    if missing:
        raise ValueError(f"{file} lacks T5X parameters the others call for: {_listing(missing)};"
                         f" {COPY_AGAIN}")
    wrong = {n: (leaves[n].shape, s) for n, (_, s, _) in expected.items()
             if leaves[n].shape != s and leaves[n].shape != _split_heads(n, s, hp)}
    if wrong:
        raise ValueError(f"{file} holds T5X parameters of unexpected shape (for d_model "
                         f"{hp['d_model']}, {hp['heads']} heads of {hp['d_kv']}, d_ff "
                         f"{hp['d_ff']}, {hp['experts']} experts): " + _listing(
                             f"{n} {g} (expected {s})" for n, (g, s) in wrong.items())
                         + f"; {COPY_AGAIN}")
    if hp["gated"] and hp["experts"]:
        raise ValueError(f"{file} has gated (wi_0, wi_1) experts; switchzoo reads T5X Switch "
                         "checkpoints with ReLU experts (wi, wo: the switch_classic releases), "
                         "as Hugging Face's SwitchTransformers computes them")
    entries = {}
    for name, (theirs, shape, kernel) in expected.items():
        leaf = leaves[name]
        if "{}" in theirs:                                          # one tensor per expert
            for e in range(shape[0]):
                entries[theirs.format(e)] = (leaf, e, shape[1:])
        else:
            entries[theirs] = (leaf, None, shape if kernel else None)
    tensors = Tensors(entries)
    hf_config = _hf_config(hp)
    try:
        cfg = hf.config_from_hf(hf_config, hp["sparse"])
    except (KeyError, ValueError) as e:
        raise ValueError(f"{file}: {errors.one_line(e)}") from None
    return hf.Pretrained(hf_config, cfg, {name: tensors for name in entries})


def _hf_config(hp: dict) -> dict:
    """The config.json Hugging Face would give this model (module doc: the defaults)."""
    common = {"vocab_size": hp["vocab"], "d_model": hp["d_model"], "d_kv": hp["d_kv"],
              "d_ff": hp["d_ff"], "num_heads": hp["heads"],
              "num_layers": hp["layers"]["encoder"],
              "num_decoder_layers": hp["layers"]["decoder"],
              "relative_attention_num_buckets": hp["buckets"],
              "tie_word_embeddings": hp["tied"], **T5_DEFAULTS}
    if not hp["experts"]:
        return {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
                "feed_forward_proj": "gated-gelu" if hp["gated"] else "relu", **common}
    return {"architectures": ["SwitchTransformersForConditionalGeneration"],
            "model_type": "switch_transformers", **common, "num_experts": hp["experts"],
            "num_sparse_encoder_layers": len(hp["sparse"]["encoder"]),
            "num_sparse_decoder_layers": len(hp["sparse"]["decoder"]), **SWITCH_DEFAULTS}
