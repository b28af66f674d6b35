"""A model's scanned and unrolled parameter forms: which layers repeat (scan_period) and the
conversion of a parameter tree between per-layer names (``decoder/layers/3/ffn/wi``) and stacked
groups (``decoder/scanned/1/ffn/wi`` [layers, ...]), as checkpoints and Hugging Face exports
need. switchzoo.transformer builds the scanned stacks themselves."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from switchzoo.config import ModelConfig

def scan_period(cfg: ModelConfig, num_layers: int, encoder: bool = False) -> int:
    """Layers per scanned group: the shortest period of the stack's dense/sparse pattern that
    divides its depth (2 for alternating Switch layers, 1 for all-dense or all-sparse stacks;
    the whole stack when nothing repeats)."""
    sparse = [cfg.moe is not None and cfg.moe.is_sparse(i, encoder) for i in range(num_layers)]
    return next(p for p in range(1, num_layers + 1) if num_layers % p == 0
                and all(sparse[i] == sparse[i % p] for i in range(num_layers)))


def _stacks(cfg: ModelConfig) -> dict[str, tuple[int, bool]]:
    """{stack name: (layers, is the encoder)} of the model's parameter tree."""
    out = {"decoder": (cfg.num_layers, False)}
    if cfg.is_encoder_decoder:
        out["encoder"] = (cfg.num_encoder_layers, True)
    return out


def groups(cfg: ModelConfig) -> dict[str, int]:
    """{stack: its scanned layer groups} (what a pipeline splits over its stages)."""
    return {name: n // scan_period(cfg, n, encoder) for name, (n, encoder) in _stacks(cfg).items()}


def stack_layers(params: dict, cfg: ModelConfig) -> dict:
    """Unrolled parameters (``decoder/layers/3/ffn/wi``, a pure dict as in a checkpoint) ->
    scanned (``decoder/scanned/1/ffn/wi`` [layers, ...]); stacks already scanned are kept."""
    out = dict(params)
    for name, (n, encoder) in _stacks(cfg).items():
        if "layers" not in params[name]:
            continue
        p = scan_period(cfg, n, encoder)
        layers = params[name]["layers"]
        out[name] = {k: v for k, v in params[name].items() if k != "layers"}
        out[name]["scanned"] = {j: jax.tree.map(lambda *xs: jnp.stack(xs),
                                                *[layers[i] for i in range(j, n, p)])
                                for j in range(p)}
    return out


def unstack_layers(params: dict, cfg: ModelConfig) -> dict:
    """The inverse of stack_layers: scanned parameters -> unrolled; unrolled stacks are kept."""
    out = dict(params)
    for name, (n, encoder) in _stacks(cfg).items():
        if "scanned" not in params[name]:
            continue
        p = scan_period(cfg, n, encoder)
        scanned = params[name]["scanned"]
        out[name] = {k: v for k, v in params[name].items() if k != "scanned"}
        out[name]["layers"] = {i: jax.tree.map(lambda x, g=i // p: x[g], scanned[i % p])
                               for i in range(n)}
    return out


def layers_as(params: dict, cfg: ModelConfig) -> dict:
    """``params`` of either form in the form ``cfg`` runs (``cfg.scan_layers``)."""
    return (stack_layers if cfg.scan_layers else unstack_layers)(params, cfg)
