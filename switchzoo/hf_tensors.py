"""Which Hugging Face tensor holds each switchzoo parameter and how its layout converts, both
ways: the names and layouts that reading (switchzoo.hf) and writing (switchzoo.hf_export)
share."""
from __future__ import annotations

import dataclasses

import numpy as np

from switchzoo import state as state_lib
from switchzoo.config import ModelConfig
from switchzoo.layers import FFN_WEIGHTS

# Copies of shared.weight that some writers store (transformers 5 with untied output layers).
ALIASES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
SINGLE = "model.safetensors"
# What each model type calls a dense feed-forward block in its tensor names; T5 differs from
# SwitchTransformers in this name alone.
DENSE_MLP = {"switch_transformers": "mlp", "t5": "DenseReluDense"}


class CheckpointError(ValueError):
    """A Hugging Face directory that does not match what it claims to hold."""


@dataclasses.dataclass(frozen=True)
class Source:
    """Where one of our parameters lives in the HF file: one tensor, or one per expert, each
    transposed (HF Linear weights are [out, in]) and reshaped into our named-dim layout."""
    names: tuple[str, ...]
    transpose: bool
    stacked: bool                      # one HF tensor per expert, stacked along 'experts'


def sources(cfg: ModelConfig, params, dense_mlp: str = "mlp") -> dict[str, Source]:
    """{our parameter path ('decoder/layers/1/ffn/wi'): its Source} for an encoder-decoder's
    abstract params; ``dense_mlp``: the dense blocks' name (DENSE_MLP)."""
    out = {("embed", "embedding"): Source(("shared.weight",), False, False)}
    if not cfg.tie_embeddings:
        out[("lm_head",)] = Source(("lm_head.weight",), True, False)
    for stack in ("encoder", "decoder"):
        ffn_at = 2 if stack == "decoder" else 1
        out[(stack, "relpos", "embedding")] = Source(
            (f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",), False, False)
        out[(stack, "final_norm", "scale")] = Source((f"{stack}.final_layer_norm.weight",), False,
                                                     False)
        for i, layer in params[stack]["layers"].items():
            _representable(layer["ffn"], f"{stack}/layers/{i}/ffn")
            hf = f"{stack}.block.{i}.layer"
            mine = (stack, "layers", i)
            for part, j, module in (("attn", 0, "SelfAttention"), ("cross", 1, "EncDecAttention")):
                if part not in layer:
                    continue
                for w in "qkvo":
                    out[mine + (part, w)] = Source((f"{hf}.{j}.{module}.{w}.weight",), True, False)
                norm = "attn_norm" if part == "attn" else "cross_norm"
                out[mine + (norm, "scale")] = Source((f"{hf}.{j}.layer_norm.weight",), False, False)
            out[mine + ("ffn_norm", "scale")] = Source((f"{hf}.{ffn_at}.layer_norm.weight",), False,
                                                       False)
            mlp = f"{hf}.{ffn_at}.mlp"
            weights = [w for w in FFN_WEIGHTS if w in layer["ffn"]]
            if "router" in layer["ffn"]:
                out[mine + ("ffn", "router", "w")] = Source((f"{mlp}.router.classifier.weight",),
                                                            True, False)
                for w in weights:
                    names = tuple(f"{mlp}.experts.expert_{e}.{w}.weight"
                                  for e in range(cfg.moe.num_experts))
                    out[mine + ("ffn", w)] = Source(names, True, True)
            else:
                for w in weights:
                    out[mine + ("ffn", w)] = Source((f"{hf}.{ffn_at}.{dense_mlp}.{w}.weight",),
                                                    True, False)
    return {state_lib.path_name(path): src for path, src in out.items()}


def _representable(ffn: dict, path: str) -> None:
    """Refuses the parameters the format has no tensors for, rather than dropping them."""
    what = ("shared experts (moe.num_shared_experts)" if "shared" in ffn else
            "a router balancing bias (moe.balance='bias')" if "bias" in ffn.get("router", {})
            else None)
    if what:
        raise CheckpointError(f"{path} has {what}, for which the Hugging Face "
                              "SwitchTransformers format has no tensors; keep such a model in "
                              "switchzoo checkpoints (its run directory), and load Hugging Face "
                              "weights into a model without it")


def hf_shape(source: Source, shape, path: str) -> tuple[int, ...]:
    """The shape of one HF tensor behind our parameter of ``shape`` at ``path``."""
    single = tuple(shape[1:] if source.stacked else shape)
    if not source.transpose:
        return single
    if len(single) == 3:       # attention: q/k/v [D, H, K] <- [H*K, D]; o [H, K, D] <- [D, H*K]
        return ((single[1] * single[2], single[0]) if not path.endswith("/o")
                else (single[2], single[0] * single[1]))
    return single[::-1]


def to_ours(hf_array: np.ndarray, source: Source, shape) -> np.ndarray:
    """One HF tensor -> our layout (one expert's slice when stacked)."""
    a = hf_array.T if source.transpose else hf_array
    return np.asarray(a, np.float32).reshape(shape)


def to_hf(ours: np.ndarray, source: Source, hf_shape) -> np.ndarray:
    if source.transpose:
        return np.ascontiguousarray(ours.reshape(tuple(hf_shape)[::-1]).T)
    return ours.reshape(hf_shape)


def leaf_at(tree, path: str):
    """The leaf of a parameter tree at a path name ('decoder/layers/1/ffn/wi')."""
    for k in path.split("/"):
        tree = tree[k] if k in tree else tree[int(k)]
    return tree
