"""Hugging Face SwitchTransformers checkpoints and dense T5 checkpoints
(T5ForConditionalGeneration: v1.0 ReLU or v1.1 gated GELU) in (config.json + safetensors).
Writing is switchzoo.hf_export (save, refusal, config_to_hf: re-exported here); the tensor
names and layouts both use are switchzoo.hf_tensors.

Every tensor is checked by name and shape before anything is placed: missing, extra and
mis-shaped tensors are errors listing the names (a converter that silently drops experts is the
failure this guards against). Tensors go straight into their sharding on the mesh, one at a time,
reading only the bytes of the shards this process holds. No pickle: .bin files are refused.

Routing losses of a model read from Hugging Face follow transformers' convention
(SwitchTransformersForConditionalGeneration), exactly: coef x (encoder term + decoder term),
each term over its stack's Switch layers together (the z-loss their mean; the aux loss one
Switch eq. 4 over the stack's layers pooled per sequence), with router_aux_loss_coef and
router_z_loss_coef. The model gets loss_reduction="pooled" (routing.pooled_aux_loss, per
routing group: a sequence, as moe.group_size 0 routes) and those coefficients as its weights.
switchzoo's own models sum per-layer losses over layers (Mesh-TensorFlow's convention), ~6x
transformers' pressure for Switch-Base's 12 Switch layers.
Not copied: transformers computes no router loss at all for a stack whose every block is
sparse (its `sparse_step > 1` test), and routes and counts padding tokens.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re

import jax
import numpy as np

from switchzoo import tensorfile, transformer
from switchzoo import state as state_lib
from switchzoo.config import ModelConfig, MoeConfig
from switchzoo.hf_export import (check_exportable, config_to_hf,  # noqa: F401 (re-exported)
                                 hf_sparse_layers, refusal, router_coefficients, save)
from switchzoo.hf_tensors import (ALIASES, DENSE_MLP, SINGLE,  # noqa: F401 (re-exported)
                                  CheckpointError, Source, hf_shape, leaf_at, sources, to_ours)

INDEX = "model.safetensors.index.json"
# A tokenizer saved beside the weights: what transformers' AutoTokenizer reads (T5's
# SentencePiece spiece.model, the fast tokenizer.json and their configs) and the SentencePiece
# model switchzoo.upcycle writes. save_pretrained copies those its model was loaded with.
TOKENIZER_FILES = ("spiece.model", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "added_tokens.json", "tokenizer.model")
LIST_AT_MOST = 8
# T5's feed_forward_proj -> our activation (gated-gelu is gelu_new: the tanh approximation).
T5_ACTIVATIONS = {"relu": "relu", "gated-gelu": "gated-gelu"}


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """A Hugging Face directory, read but not loaded: its config.json as written, our
    ModelConfig of it, and {tensor name: the safetensors file holding it}."""
    hf_config: dict
    cfg: ModelConfig
    files: dict

    @property
    def dense_mlp(self) -> str:
        return DENSE_MLP[self.hf_config["model_type"]]




# -------------------------------------------------------------------------------------- config


def read_tokenizer(path) -> dict[str, bytes]:
    """{file name: bytes} of the tokenizer files (TOKENIZER_FILES) a directory holds."""
    path = pathlib.Path(path)
    return {name: (path / name).read_bytes() for name in TOKENIZER_FILES
            if (path / name).is_file()}


def config_from_hf(hf: dict, sparse: dict[str, tuple[int, ...]]) -> ModelConfig:
    """ModelConfig of a SwitchTransformers or T5 config.json; ``sparse`` lists each stack's
    sparse layers as found in the weights (trusted over the config's sparse-step rule)."""
    if hf.get("model_type") not in DENSE_MLP:
        raise CheckpointError(f"config.json has model_type {hf.get('model_type')!r}; only "
                              "'switch_transformers' and 't5' checkpoints are read")
    activation = "relu"
    if hf["model_type"] == "t5":
        activation = T5_ACTIVATIONS.get(hf.get("feed_forward_proj", "relu"))
        if activation is None:
            raise CheckpointError(f"config.json asks for feed_forward_proj "
                                  f"{hf.get('feed_forward_proj')!r}; T5 checkpoints with "
                                  f"{' or '.join(T5_ACTIVATIONS)} feed-forward blocks are read")
    elif hf.get("dense_act_fn", "relu") != "relu" or hf.get("router_bias"):
        raise CheckpointError("config.json asks for dense_act_fn "
                              f"{hf.get('dense_act_fn')!r} / router_bias {hf.get('router_bias')}; "
                              "only ReLU experts without router bias (the published Switch "
                              "checkpoints) are supported")
    # transformers 5 writes T5 v1.1's untied output layer as tied and unscaled; ours is tied
    # with the d_model**-0.5 scale, or untied.
    tied = hf.get("tie_word_embeddings", True)
    if hf.get("scale_decoder_outputs", tied) != tied:
        raise CheckpointError("config.json ties the output layer to the embedding without the "
                              "d_model**-0.5 logit scale (scale_decoder_outputs false: how "
                              "transformers 5 writes T5 v1.1); switchzoo reads tied-and-scaled "
                              "(T5 v1.0) or untied output layers with their own lm_head.weight")
    moe = None
    if sparse["encoder"] or sparse["decoder"]:
        # transformers' convention (module doc): its coefficients weigh each stack's pooled
        # aux loss and mean z-loss, and the stacks' terms add.
        moe = MoeConfig(
            num_experts=hf["num_experts"], top_k=1, group_size=0,
            expert_capacity=hf["expert_capacity"], jitter=hf.get("router_jitter_noise", 0.0),
            aux_loss_weight=hf.get("router_aux_loss_coef", 0.001),
            z_loss_weight=hf.get("router_z_loss_coef", 0.001), loss_reduction="pooled",
            encoder_sparse_layers=sparse["encoder"], sparse_layers=sparse["decoder"])
    return ModelConfig(
        vocab_size=hf["vocab_size"], d_model=hf["d_model"], num_heads=hf["num_heads"],
        d_kv=hf["d_kv"], d_ff=hf["d_ff"], num_encoder_layers=hf["num_layers"],
        num_layers=hf.get("num_decoder_layers") or hf["num_layers"], activation=activation,
        dropout=hf.get("dropout_rate", 0.1),
        relpos_buckets=hf.get("relative_attention_num_buckets", 32),
        relpos_max_distance=hf.get("relative_attention_max_distance", 128),
        tie_embeddings=tied, moe=moe)


def _files(path: pathlib.Path) -> dict[str, tensorfile.TensorFile]:
    """{tensor name: the file holding it} for a single file or a sharded index."""
    if (path / INDEX).is_file():
        weight_map = json.loads((path / INDEX).read_text())["weight_map"]
        opened = {f: tensorfile.TensorFile(path / f) for f in sorted(set(weight_map.values()))}
        for name, f in weight_map.items():
            if name not in opened[f].header:
                raise CheckpointError(f"{path / INDEX} places {name} in {f}, which does not hold "
                                      "it; the index and the shards disagree")
        return {name: opened[f] for name, f in weight_map.items()}
    if (path / SINGLE).is_file():
        f = tensorfile.TensorFile(path / SINGLE)
        return {name: f for name in f.names()}
    pickled = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt*"))
    hint = (f" (found {', '.join(pickled)}: pickle files are never loaded; convert them with "
            "transformers' save_pretrained(safe_serialization=True))") if pickled else ""
    raise CheckpointError(f"{path}: no {SINGLE} or {INDEX}{hint}")


def _sparse_layers(names, stack: str) -> tuple[int, ...]:
    pattern = re.compile(rf"^{stack}\.block\.(\d+)\.layer\.\d+\.mlp\.router\.classifier\.weight$")
    return tuple(sorted(int(m.group(1)) for n in names if (m := pattern.match(n))))


def _listing(names) -> str:
    names = sorted(names)
    more = f" and {len(names) - LIST_AT_MOST} more" if len(names) > LIST_AT_MOST else ""
    return ", ".join(names[:LIST_AT_MOST]) + more


def read_config(path) -> Pretrained:
    """The config and tensor index of a Hugging Face directory (no weights read yet)."""
    path = pathlib.Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a directory; pass a Hugging Face model directory "
                              "(config.json + model.safetensors)")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path} has no config.json, so it is not a Hugging Face model "
                              "directory; pass the folder holding config.json and the weights")
    try:
        hf = json.loads((path / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path / 'config.json'} is not valid JSON ({e})") from None
    try:
        files = _files(path)
    except tensorfile.TensorFileError as e:
        raise CheckpointError(str(e)) from None
    sparse = {s: _sparse_layers(files, s) for s in ("encoder", "decoder")}
    try:
        return Pretrained(hf, config_from_hf(hf, sparse), files)
    except KeyError as e:
        raise CheckpointError(f"{path / 'config.json'} lacks the key {e}") from None


def check(cfg: ModelConfig, params, files: dict, dense_mlp: str = "mlp") -> dict[tuple, Source]:
    """Every expected tensor present with its shape, nothing unexplained left over."""
    srcs = sources(cfg, params, dense_mlp)
    expected = {}
    for path, src in srcs.items():
        for name in src.names:
            expected[name] = hf_shape(src, leaf_at(params, path).shape, path)
    aliases = set(ALIASES) | ({"lm_head.weight"} if cfg.tie_embeddings else set())
    missing = set(expected) - set(files)
    extra = set(files) - set(expected) - aliases
    wrong = {n: (files[n].shape(n), s) for n, s in expected.items()
             if n in files and files[n].shape(n) != s}
    problems = []
    if missing:
        problems.append(f"missing tensors: {_listing(missing)}")
    if extra:
        problems.append(f"unexpected tensors (not part of this config; refusing to drop "
                        f"them): {_listing(extra)}")
    if wrong:
        problems.append("mis-shaped tensors: " + _listing(
            f"{n} {tuple(g)} (config says {s})" for n, (g, s) in wrong.items()))
    for alias in sorted(aliases & set(files)):
        if not np.array_equal(files[alias].get(alias), files["shared.weight"].get("shared.weight")):
            problems.append(f"{alias} differs from shared.weight; switchzoo models share one "
                            "input embedding between encoder and decoder (and, when tied, the "
                            "output layer), as the published Switch checkpoints do")
    if problems:
        raise CheckpointError("checkpoint does not match its config.json: " + "; ".join(problems))
    return srcs


def load_params(pretrained: Pretrained, setup: state_lib.Setup):
    """Places every tensor into its sharding (``setup``: state.setup of ``pretrained.cfg``,
    without an optimizer), reading only the shards this process holds. Returns (params, file
    facts: each tensor's dtype and the aliases present). A scanned set-up (``scan_layers``)
    gets the per-layer tensors stacked into its scanned parameters."""
    if setup.cfg.scan_layers:
        unrolled = state_lib.setup(setup.cfg.replace(scan_layers=False), setup.layout)
        params, facts = load_params(pretrained, unrolled)
        stack = jax.jit(lambda p: transformer.stack_layers(p, setup.cfg),
                        out_shardings=setup.param_shardings)
        return stack(params), facts
    files = pretrained.files
    srcs = check(pretrained.cfg, setup.abstract_params, files, pretrained.dense_mlp)
    facts = {"aliases": [a for a in ALIASES if a in files], "dtypes": {}}

    def place(path, leaf, sharding):
        name = state_lib.path_name(path)
        src = srcs[name]
        facts["dtypes"][name] = str(files[src.names[0]].dtype(src.names[0]))
        if src.stacked:
            def shard(index):
                experts = range(*index[0].indices(leaf.shape[0]))
                return np.stack([to_ours(files[src.names[e]].get(src.names[e]), src,
                                         leaf.shape[1:])[index[1:]] for e in experts])
        else:
            whole = to_ours(files[src.names[0]].get(src.names[0]), src, leaf.shape)

            def shard(index):
                return whole[index]
        return jax.make_array_from_callback(leaf.shape, sharding, shard)

    params = jax.tree_util.tree_map_with_path(place, setup.abstract_params,
                                              setup.param_shardings)
    return params, facts


