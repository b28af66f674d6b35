"""Transformer assemblies on the named-dimension layers: the T5/Switch encoder-decoder and the
decoder-only LM. Pre-norm RMSNorm, relative-position bias shared by the layers of a stack, no
biases; which FFNs are Switch layers is decided per stack by ``MoeConfig.is_sparse``."""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from switchzoo.config import ModelConfig
from switchzoo.layers import (Attention, Embed, Mlp, RelativePositionBias, RMSNorm, dropout,
                              param, split)
from switchzoo.layout import constrain
from switchzoo.moe import SwitchFFN


class Block(nnx.Module):
    """Self-attention, cross-attention (decoder of an encoder-decoder), then a dense or Switch
    feed-forward block; each pre-normed, each added to the residual stream."""

    def __init__(self, cfg: ModelConfig, index: int, cross: bool, rngs: nnx.Rngs,
                 encoder: bool = False):
        self.rate = cfg.dropout
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = Attention(cfg.d_model, cfg.num_heads, cfg.d_kv, rngs)
        if cross:
            self.cross_norm = RMSNorm(cfg.d_model)
            self.cross = Attention(cfg.d_model, cfg.num_heads, cfg.d_kv, rngs)
        self.ffn_norm = RMSNorm(cfg.d_model)
        sparse = cfg.moe is not None and cfg.moe.is_sparse(index, encoder)
        self.ffn = (SwitchFFN(cfg.d_model, cfg.d_ff, cfg.moe, rngs) if sparse
                    else Mlp(cfg.d_model, cfg.d_ff, rngs, cfg.activation))

    def __call__(self, x_BTD, bias_BHTT, mask_BTT, enc_BSD=None, mask_BTS=None, rng=None,
                 valid_BT=None):
        r_attn, r1, r_cross, r2, r_ffn, r3 = split(rng, 6)
        h_BTD = self.attn_norm(x_BTD)
        h_BTD = self.attn(h_BTD, h_BTD, bias_BHTT, mask_BTT, self.rate, r_attn)
        x_BTD = x_BTD + dropout(h_BTD, self.rate, r1)
        if enc_BSD is not None:
            h_BTD = self.cross(self.cross_norm(x_BTD), enc_BSD, 0.0, mask_BTS, self.rate, r_cross)
            x_BTD = x_BTD + dropout(h_BTD, self.rate, r2)
        h_BTD, stats = self.ffn(self.ffn_norm(x_BTD), self.rate, r_ffn, valid_BT)
        x_BTD = x_BTD + dropout(h_BTD, self.rate, r3)
        return constrain(x_BTD, ("batch", "length", "d_model")), stats


class Stack(nnx.Module):
    """Layers over embedded tokens, then the final norm (an encoder or a decoder)."""

    def __init__(self, cfg: ModelConfig, num_layers: int, causal: bool, cross: bool,
                 rngs: nnx.Rngs, encoder: bool = False):
        self.cfg, self.causal = cfg, causal
        self.relpos = RelativePositionBias(cfg.relpos_buckets, cfg.relpos_max_distance,
                                           cfg.num_heads, bidirectional=not causal, rngs=rngs)
        self.layers = nnx.List([Block(cfg, i, cross, rngs, encoder) for i in range(num_layers)])
        self.final_norm = RMSNorm(cfg.d_model)

    def __call__(self, x_BTD, positions_BT, segments_BT, enc_BSD=None, enc_segments_BS=None,
                 rng=None):
        """Segments mark packed sequences (0 = padding); returns x_BTD and the Switch stats."""
        T = x_BTD.shape[1]
        mask_BTT = segments_BT[:, :, None] == segments_BT[:, None, :]
        if self.causal:
            mask_BTT = mask_BTT & jnp.tril(jnp.ones((T, T), bool))
        mask_BTS = None
        if enc_BSD is not None:
            mask_BTS = ((segments_BT[:, :, None] == enc_segments_BS[:, None, :])
                        & (enc_segments_BS[:, None, :] != 0))
        bias_BHTT = self.relpos(positions_BT, positions_BT)
        r_in, r_out, *r_layers = split(rng, len(self.layers) + 2)
        x_BTD = dropout(x_BTD, self.cfg.dropout, r_in)
        stats = []
        for layer, r in zip(self.layers, r_layers):
            x_BTD, s = layer(x_BTD, bias_BHTT, mask_BTT, enc_BSD, mask_BTS, r, segments_BT != 0)
            if s:
                stats.append(s)
        return dropout(self.final_norm(x_BTD), self.cfg.dropout, r_out), stats


def _defaults(ids_BL, positions_BL, segments_BL):
    B, L = ids_BL.shape
    if positions_BL is None:
        positions_BL = jnp.broadcast_to(jnp.arange(L), (B, L))
    if segments_BL is None:
        segments_BL = jnp.ones((B, L), jnp.int32)
    return positions_BL, segments_BL


class _Head(nnx.Module):
    """Shared embedding and output layer: tied (scaled by d_model**-0.5) or a separate matrix."""

    def _init_head(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = Embed(cfg.vocab_size, cfg.d_model, rngs)
        if not cfg.tie_embeddings:
            self.lm_head = param(rngs, cfg.d_model ** -0.5, (cfg.d_model, cfg.vocab_size),
                                 ("d_model", "vocab"))

    def _logits(self, x_BLD):
        if self.cfg.tie_embeddings:
            logits_BLV = self.embed.attend(x_BLD * self.cfg.d_model ** -0.5)
        else:
            logits_BLV = jnp.einsum("BLD,DV->BLV", x_BLD, self.lm_head[...].astype(x_BLD.dtype))
            logits_BLV = constrain(logits_BLV, ("batch", "length", "vocab"))
        return logits_BLV.astype(jnp.float32)


class DecoderLM(_Head):
    """Decoder-only language model (a T5 decoder without cross-attention)."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self._init_head(cfg, rngs)
        self.decoder = Stack(cfg, cfg.num_layers, causal=True, cross=False, rngs=rngs)

    def __call__(self, ids_BL, *, positions_BL=None, segments_BL=None, rng=None):
        """Returns float32 logits [B, L, V] and the Switch losses/metrics (see ``_stack``).
        ``rng`` None means evaluation (no dropout or jitter, the eval capacity factor)."""
        positions_BL, segments_BL = _defaults(ids_BL, positions_BL, segments_BL)
        x_BLD = self.embed(ids_BL, jnp.dtype(self.cfg.dtype))
        x_BLD, stats = self.decoder(x_BLD, positions_BL, segments_BL, rng=rng)
        return self._logits(x_BLD), _stack(stats)


class EncoderDecoder(_Head):
    """The T5 / Switch Transformer encoder-decoder."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self._init_head(cfg, rngs)
        self.encoder = Stack(cfg, cfg.num_encoder_layers, causal=False, cross=False, rngs=rngs,
                             encoder=True)
        self.decoder = Stack(cfg, cfg.num_layers, causal=True, cross=True, rngs=rngs)

    def encode(self, src_BS, *, positions_BS=None, segments_BS=None, rng=None):
        positions_BS, segments_BS = _defaults(src_BS, positions_BS, segments_BS)
        x_BSD = self.embed(src_BS, jnp.dtype(self.cfg.dtype))
        return self.encoder(x_BSD, positions_BS, segments_BS, rng=rng)

    def __call__(self, src_BS, tgt_BT, *, src_positions=None, src_segments=None,
                 tgt_positions=None, tgt_segments=None, rng=None):
        """Source ids [B, S] and decoder input ids [B, T] (targets shifted right) -> float32
        logits [B, T, V] and the Switch losses/metrics of both stacks."""
        r_enc, r_dec = split(rng, 2)
        src_positions, src_segments = _defaults(src_BS, src_positions, src_segments)
        tgt_positions, tgt_segments = _defaults(tgt_BT, tgt_positions, tgt_segments)
        enc_BSD, enc_stats = self.encode(src_BS, positions_BS=src_positions,
                                         segments_BS=src_segments, rng=r_enc)
        y_BTD = self.embed(tgt_BT, jnp.dtype(self.cfg.dtype))
        y_BTD, dec_stats = self.decoder(y_BTD, tgt_positions, tgt_segments, enc_BSD,
                                        src_segments, rng=r_dec)
        return self._logits(y_BTD), _stack(enc_stats + dec_stats)


def _stack(stats: list[dict]) -> dict:
    """Sums the losses over Switch layers; stacks their metrics along a leading layer axis."""
    if not stats:
        zero = jnp.zeros((), jnp.float32)
        return {"aux_loss": zero, "z_loss": zero}
    out = {k: jnp.stack([s[k] for s in stats]) for k in stats[0]}
    out["aux_loss"] = jnp.sum(out["aux_loss"])
    out["z_loss"] = jnp.sum(out["z_loss"])
    return out


def build(cfg: ModelConfig, seed: int = 0) -> DecoderLM | EncoderDecoder:
    cls = EncoderDecoder if cfg.num_encoder_layers else DecoderLM
    return cls(cfg, nnx.Rngs(params=seed))
