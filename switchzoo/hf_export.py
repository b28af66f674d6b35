"""Switchzoo models out to Hugging Face (config.json + model.safetensors): a Switch model as
SwitchTransformers, a dense one as T5, and a refusal in one line (``refusal``) for every model
transformers would compute another function from. Reading is switchzoo.hf, which re-exports
these."""
from __future__ import annotations

import json
import pathlib

import jax
import numpy as np

from switchzoo import atomic, tensorfile, transformer
from switchzoo.config import ModelConfig
from switchzoo.hf_tensors import (ALIASES, DENSE_MLP, SINGLE, CheckpointError, hf_shape, leaf_at,
                                  sources, to_hf)


def hf_sparse_layers(num_layers: int, num_sparse: int) -> tuple[int, ...]:
    """The blocks transformers' SwitchTransformersStack makes sparse for a config's
    num_(sparse_)layers: i % step == 1 (every block where step is 1), step = num_layers //
    num_sparse, or num_layers where num_sparse is 0 (so a stack is never all dense)."""
    step = num_layers // num_sparse if num_sparse > 0 else num_layers
    return tuple(i for i in range(num_layers) if step > 0 and (i % step == 1 or step == 1))


def refusal(cfg: ModelConfig) -> str | None:
    """Why transformers would compute another function from this model's Hugging Face export
    (one line, with what to do instead), or None: it can be written. Training-only settings
    (jitter, dropout, the routing losses) and execution ones (dispatch, scanning, remat,
    attention kernel, activation dtype) do not change the logits. Capacity is a run-time
    setting in both libraries: a fixed moe.expert_capacity, each sequence routed alone at
    evaluation (moe.eval_groups='sequence', the default, or group_size 0), is written as it is
    (the same logits); capacity factors (slots that follow a group's length) have no Hugging
    Face form, so such a model is refused, and save_pretrained(expert_capacity=N) exports it
    with N fixed slots (api.Model.save_pretrained)."""
    keep = "keep it in switchzoo checkpoints (its run directory)"
    moe = cfg.moe
    if not cfg.is_encoder_decoder:
        return ("a decoder-only model: Hugging Face's SwitchTransformers and T5 are "
                f"encoder-decoders; {keep}")
    if moe is None:
        if not cfg.tie_embeddings:
            return ("a dense model with an untied output layer: transformers' T5 always ties "
                    f"it to the embedding; {keep}")
        return None
    if cfg.activation != "relu":
        return (f"Switch experts with activation {cfg.activation!r}: SwitchTransformers "
                f"experts are ReLU (wi, wo); {keep}")
    if moe.router != "tokens_choose":
        # The weights would fit, but transformers would route them tokens-choose.
        return (f"moe.router={moe.router!r}: Hugging Face SwitchTransformers routes "
                f"tokens-choose only, so it would compute another model; {keep}")
    if moe.top_k != 1:
        return (f"moe.top_k={moe.top_k}: SwitchTransformers routes each token to one expert "
                f"(top-1); {keep}")
    if moe.gates_sum_to_one:
        return ("moe.gates_sum_to_one: transformers scales each expert's output by the raw "
                "router probability (~1/E for an upcycled router) where this model "
                f"renormalises it to 1; {keep}")
    if moe.num_shared_experts or moe.balance == "bias":
        what = ("shared experts (moe.num_shared_experts)" if moe.num_shared_experts
                else "a router balancing bias (moe.balance='bias')")
        return (f"the model has {what}, for which the Hugging Face SwitchTransformers format "
                f"has no tensors; {keep}, and load Hugging Face weights into a model without it")
    if moe.expert_capacity is None:
        return ("moe.expert_capacity is unset: this model's capacity is a factor of each "
                "routing group's tokens, transformers' a fixed number of slots per expert per "
                "sequence, so the two would drop different tokens; save with "
                "save_pretrained(path, expert_capacity=N) (the export then routes each sequence "
                "with N slots per expert, as transformers does; N >= the longest sequence drops "
                f"nothing), or {keep}")
    if moe.group_size and moe.eval_groups == "train":
        return (f"moe.eval_groups='train' routes groups of {moe.group_size} tokens across "
                "sequences, where transformers routes each sequence alone; evaluate with "
                f"moe.eval_groups='sequence', or {keep}")
    for stack, n, encoder in (("encoder", cfg.num_encoder_layers, True),
                              ("decoder", cfg.num_layers, False)):
        ours = tuple(i for i in range(n) if moe.is_sparse(i, encoder))
        theirs = hf_sparse_layers(n, len(ours))
        if ours != theirs:
            return (f"the {stack}'s Switch layers are {list(ours)}, but transformers makes "
                    f"blocks {list(theirs)} of a {n}-block stack with {len(ours)} sparse layers "
                    f"sparse (i % (blocks // sparse) == 1); {keep} (models made for it use "
                    "moe.sparse_every=2, moe.sparse_offset=1: the published layout)")
    return None


def check_exportable(cfg: ModelConfig) -> None:
    """Raises CheckpointError (refusal's line) for a model the format cannot hold."""
    why = refusal(cfg)
    if why:
        raise CheckpointError(f"cannot save in Hugging Face format: {why}")


def router_coefficients(cfg: ModelConfig) -> tuple[float, float]:
    """transformers' (router_aux_loss_coef, router_z_loss_coef) that put the routing-loss
    pressure of ``cfg``'s weights on its Switch layers: transformers pools each stack's layers
    and adds the stacks (switchzoo.hf's module doc), as loss_reduction "pooled" does, so its
    weights are the coefficients; a mean over all layers weighted w is w / stacks and a sum
    weighted w is w x layers / stacks (the z-loss exactly, and the aux loss as its per-layer
    terms, where the stacks have as many Switch layers each). The inverse of config_from_hf's
    weights."""
    moe = cfg.moe
    if moe.loss_reduction == "pooled":
        return moe.aux_loss_weight, moe.z_loss_weight
    counts = (sum(moe.is_sparse(i, True) for i in range(cfg.num_encoder_layers)),
              sum(moe.is_sparse(i) for i in range(cfg.num_layers)))
    stacks = max(sum(1 for n in counts if n), 1)
    scale = (sum(counts) if moe.loss_reduction == "sum" else 1) / stacks
    return moe.aux_loss_weight * scale, moe.z_loss_weight * scale


def config_to_hf(cfg: ModelConfig) -> dict:
    """The config.json for a model that did not come from one: SwitchTransformers for a Switch
    model, T5 (T5ForConditionalGeneration) for a dense one, which transformers cannot build as
    SwitchTransformers (hf_sparse_layers); a CheckpointError where transformers would compute
    another function (refusal)."""
    check_exportable(cfg)
    common = {
        "vocab_size": cfg.vocab_size, "d_model": cfg.d_model, "d_kv": cfg.d_kv, "d_ff": cfg.d_ff,
        "num_heads": cfg.num_heads, "num_layers": cfg.num_encoder_layers,
        "num_decoder_layers": cfg.num_layers,
        "relative_attention_num_buckets": cfg.relpos_buckets,
        "relative_attention_max_distance": cfg.relpos_max_distance,
        "dropout_rate": cfg.dropout, "layer_norm_epsilon": 1e-6,
        "tie_word_embeddings": cfg.tie_embeddings, "is_encoder_decoder": True,
        "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0,
    }
    moe = cfg.moe
    if moe is None:
        return {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
                "feed_forward_proj": cfg.activation, **common}
    enc = [i for i in range(cfg.num_encoder_layers) if moe.is_sparse(i, True)]
    dec = [i for i in range(cfg.num_layers) if moe.is_sparse(i)]
    aux, z = router_coefficients(cfg)
    return {
        "architectures": ["SwitchTransformersForConditionalGeneration"],
        "model_type": "switch_transformers", **common,
        "num_sparse_encoder_layers": len(enc), "num_sparse_decoder_layers": len(dec),
        "num_experts": moe.num_experts, "expert_capacity": moe.expert_capacity,
        "router_bias": False, "router_jitter_noise": moe.jitter, "router_dtype": "float32",
        "router_aux_loss_coef": aux, "router_z_loss_coef": z, "dense_act_fn": "relu",
    }


def save(path, cfg: ModelConfig, params, hf_config: dict | None = None,
         facts: dict | None = None, tokenizer: dict[str, bytes] | None = None) -> None:
    """Writes config.json + model.safetensors (HF names and layouts), streaming one tensor at a
    time to disk, and ``tokenizer`` (hf.read_tokenizer's files) beside them. ``facts`` (from
    loading) restore each tensor's dtype and the alias copies the source held, so a round trip
    is bit-identical. Scanned parameters are written per layer, under the ordinary names."""
    check_exportable(cfg)
    hf_config = hf_config or config_to_hf(cfg)
    params = transformer.unstack_layers(params, cfg)
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    facts = facts or {}
    dtypes = facts.get("dtypes", {})
    specs, makers = {}, {}
    for key, src in sources(cfg, params, DENSE_MLP[hf_config["model_type"]]).items():
        leaf = leaf_at(params, key)
        dtype = np.dtype(dtypes.get(key, "float32"))
        shape = hf_shape(src, leaf.shape, key)
        for e, name in enumerate(src.names):
            specs[name] = (shape, dtype)

            def make(leaf=leaf, e=e, src=src, shape=shape, dtype=dtype):
                ours = np.asarray(jax.device_get(leaf[e] if src.stacked else leaf))
                return to_hf(ours, src, shape).astype(dtype)
            makers[name] = make
    for alias in facts.get("aliases", [] if cfg.tie_embeddings else list(ALIASES)):
        specs[alias], makers[alias] = specs["shared.weight"], makers["shared.weight"]
    tensorfile.write(path / SINGLE, specs, makers, {"format": "pt"})
    for name, data in (tokenizer or {}).items():
        atomic.write_bytes(path / name, data)
    atomic.write_text(path / "config.json", json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
