"""Transformer assemblies on the named-dimension layers. For now: the decoder-only LM."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from switchzoo.config import ModelConfig
from switchzoo.layers import (Attention, Embed, Mlp, RelativePositionBias, RMSNorm, dropout,
                              param, split)
from switchzoo.layout import constrain
from switchzoo.moe import SwitchFFN


class DecoderLayer(nnx.Module):
    """Pre-norm self-attention then a dense or Switch feed-forward block, with residuals."""

    def __init__(self, cfg: ModelConfig, index: int, rngs: nnx.Rngs):
        self.rate = cfg.dropout
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = Attention(cfg.d_model, cfg.num_heads, cfg.d_kv, rngs)
        self.ffn_norm = RMSNorm(cfg.d_model)
        sparse = cfg.moe is not None and cfg.moe.is_sparse(index)
        self.ffn = (SwitchFFN(cfg.d_model, cfg.d_ff, cfg.moe, rngs) if sparse
                    else Mlp(cfg.d_model, cfg.d_ff, rngs))

    def __call__(self, x_BLD, bias_BHLL, mask_BLL, rng=None):
        r_attn, r_res1, r_ffn, r_res2 = split(rng, 4)
        h_BLD = self.attn_norm(x_BLD)
        h_BLD = self.attn(h_BLD, h_BLD, bias_BHLL, mask_BLL, self.rate, r_attn)
        x_BLD = x_BLD + dropout(h_BLD, self.rate, r_res1)
        h_BLD, stats = self.ffn(self.ffn_norm(x_BLD), self.rate, r_ffn)
        x_BLD = x_BLD + dropout(h_BLD, self.rate, r_res2)
        return constrain(x_BLD, ("batch", "length", "d_model")), stats


class DecoderLM(nnx.Module):
    """Decoder-only language model (T5 decoder without cross-attention)."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = Embed(cfg.vocab_size, cfg.d_model, rngs)
        self.relpos = RelativePositionBias(cfg.relpos_buckets, cfg.relpos_max_distance,
                                           cfg.num_heads, bidirectional=False, rngs=rngs)
        self.layers = nnx.List([DecoderLayer(cfg, i, rngs) for i in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.d_model)
        if not cfg.tie_embeddings:
            self.lm_head = param(rngs, cfg.d_model ** -0.5, (cfg.d_model, cfg.vocab_size),
                                 ("d_model", "vocab"))

    def __call__(self, ids_BL, *, positions_BL=None, segments_BL=None, rng=None):
        """Returns float32 logits [B, L, V] and the MoE losses/metrics.

        ``segments_BL`` marks packed sequences (0 = padding); ``rng`` None means evaluation.
        Metrics of the Switch layers are stacked along a leading layer axis.
        """
        cfg = self.cfg
        B, L = ids_BL.shape
        if positions_BL is None:
            positions_BL = jnp.broadcast_to(jnp.arange(L), (B, L))
        if segments_BL is None:
            segments_BL = jnp.ones((B, L), jnp.int32)
        causal_LL = jnp.tril(jnp.ones((L, L), bool))
        mask_BLL = causal_LL & (segments_BL[:, :, None] == segments_BL[:, None, :])
        bias_BHLL = self.relpos(positions_BL, positions_BL)
        r_embed, *r_layers = split(rng, cfg.num_layers + 1)

        x_BLD = dropout(self.embed(ids_BL, jnp.dtype(cfg.dtype)), cfg.dropout, r_embed)
        all_stats = []
        for layer, r in zip(self.layers, r_layers):
            x_BLD, stats = layer(x_BLD, bias_BHLL, mask_BLL, r)
            if stats:
                all_stats.append(stats)
        x_BLD = self.final_norm(x_BLD)
        if cfg.tie_embeddings:
            logits_BLV = self.embed.attend(x_BLD * cfg.d_model ** -0.5)
        else:
            logits_BLV = jnp.einsum("BLD,DV->BLV", x_BLD, self.lm_head[...].astype(x_BLD.dtype))
            logits_BLV = constrain(logits_BLV, ("batch", "length", "vocab"))
        return logits_BLV.astype(jnp.float32), _stack(all_stats)


def _stack(stats: list[dict]) -> dict:
    """Sums the losses over Switch layers; stacks their metrics along a leading layer axis."""
    if not stats:
        zero = jnp.zeros((), jnp.float32)
        return {"aux_loss": zero, "z_loss": zero}
    out = {k: jnp.stack([s[k] for s in stats]) for k in stats[0]}
    out["aux_loss"] = jnp.sum(out["aux_loss"])
    out["z_loss"] = jnp.sum(out["z_loss"])
    return out


def build(cfg: ModelConfig, seed: int = 0) -> DecoderLM:
    return DecoderLM(cfg, nnx.Rngs(params=seed))
