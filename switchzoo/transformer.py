"""Transformer assemblies on the named-dimension layers: the T5/Switch encoder-decoder and the
decoder-only LM. Pre-norm RMSNorm, relative-position bias shared by the layers of a stack, no
biases; which FFNs are Switch layers is decided per stack by ``MoeConfig.is_sparse``.

Decoding runs the same code with a cache: per layer the self-attention keys/values [B, H, Tmax, K]
written at ``index`` (and the cross-attention keys/values of the encoder output), plus which
cached positions hold tokens (``valid``)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from switchzoo import config as config_lib
from switchzoo import dims as dims_lib
from switchzoo import pipeline
from switchzoo.config import ModelConfig
from switchzoo.attention_impl import attention_impl
from switchzoo.relpos import RelativePositionBias
from switchzoo.layers import (MINIMAL_SAVED, Attention, Embed, Init, Mlp,
                              RMSNorm, dropout, split)
from switchzoo.layout import active, constrain
from switchzoo import layers, masks, moe
from switchzoo.moe import SwitchFFN
from switchzoo.scanned import (layers_as, scan_period,  # noqa: F401 (re-exported)
                               stack_layers, unstack_layers)

# ModelConfig.remat -> the jax.checkpoint policy of each block (and scanned group): "full" saves
# nothing and recomputes the block in the backward pass, "dots" saves the matmul outputs and
# recomputes the rest (norms, activations, softmax, routing); "minimal" saves only the
# projections (q, k, v, attention output, FFN and expert wi/wo) and the attention context,
# tagged in layers.py (MINIMAL_SAVED): no scores or probabilities [B, H, T, S], no routing
# masks [G, N, E, C], which "dots" keeps (they are matmul outputs too).
REMAT_POLICIES = {"none": None, "full": jax.checkpoint_policies.nothing_saveable,
                  "dots": jax.checkpoint_policies.dots_saveable,
                  "minimal": layers.minimal_policy()}
assert tuple(REMAT_POLICIES) == config_lib.REMAT


def _remat(module: nnx.Module, policy):
    """``module``'s call under jax.checkpoint with ``policy`` (None: the module itself)."""
    if policy is None:
        return module
    graphdef, params = nnx.split(module)

    def call(params, *args):
        return nnx.merge(graphdef, params)(*args)
    return functools.partial(jax.checkpoint(call, policy=policy), params)


def _stacked(modules: list[nnx.Module]) -> nnx.Module:
    """One module of the same structure whose every parameter is the modules' stacked along a
    leading 'layers' dim (split over a stage axis by pipelining, else whole on every device)."""
    def stack(*variables):
        meta = variables[0].get_metadata()
        dims = dims_lib.check(("layers",) + tuple(meta["dims"]), "stacked parameter")
        return type(variables[0])(jnp.stack([v[...] for v in variables]),
                                  **{**meta, "dims": dims})
    graphdef, _ = nnx.split(modules[0])
    params = jax.tree.map(stack, *[nnx.state(m) for m in modules],
                          is_leaf=lambda x: isinstance(x, nnx.Variable))
    return nnx.merge(graphdef, params)


class Block(nnx.Module):
    """Self-attention, cross-attention (decoder of an encoder-decoder), then a dense or Switch
    feed-forward block; each pre-normed, each added to the residual stream."""

    def __init__(self, cfg: ModelConfig, index: int, cross: bool, rngs: nnx.Rngs,
                 encoder: bool = False, causal: bool = False):
        self.rate, self.has_cross = cfg.dropout, cross
        init = Init.of(cfg)
        impl = attention_impl(cfg)
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = Attention(cfg.d_model, cfg.num_heads, cfg.d_kv, rngs, init, impl.name,
                              causal, impl.strict)
        if cross:
            self.cross_norm = RMSNorm(cfg.d_model)
            self.cross = Attention(cfg.d_model, cfg.num_heads, cfg.d_kv, rngs, init, impl.name,
                                   strict=impl.strict)
        self.ffn_norm = RMSNorm(cfg.d_model)
        sparse = cfg.moe is not None and cfg.moe.is_sparse(index, encoder)
        self.ffn = (SwitchFFN(cfg.d_model, cfg.d_ff, cfg.moe, rngs, cfg.activation, encoder,
                              init, cfg.dropout)
                    if sparse else Mlp(cfg.d_model, cfg.d_ff, rngs, cfg.activation, cfg.dropout,
                                       init))

    def __call__(self, x_BTD, bias_BHTS, mask, enc_BSD=None, cross_mask=None, rng=None,
                 valid_BT=None, cache=None, index=None):
        """Returns (x_BTD, Switch stats, cache); with a cache, this block's new keys/values are
        written at ``index`` and attention runs over the whole cache."""
        r_attn, r1, r_cross, r2, r_ffn, r3 = split(rng, 6)
        h_BTD = self.attn_norm(x_BTD)
        k_BHSK, v_BHSK = self.attn.project_kv(h_BTD)
        if cache is not None:
            k_BHSK = jax.lax.dynamic_update_slice(cache["k"], k_BHSK, (0, 0, index, 0))
            v_BHSK = jax.lax.dynamic_update_slice(cache["v"], v_BHSK, (0, 0, index, 0))
            cache = {**cache, "k": k_BHSK, "v": v_BHSK}
        fused = cache is None                   # decoding steps run the reference path
        h_BTD = self.attn.attend(h_BTD, k_BHSK, v_BHSK, bias_BHTS, mask, self.rate, r_attn,
                                 fused)
        x_BTD = x_BTD + dropout(h_BTD, self.rate, r1)
        if self.has_cross:
            kv = ((cache["cross_k"], cache["cross_v"]) if cache is not None
                  else self.cross.project_kv(enc_BSD))
            h_BTD = self.cross.attend(self.cross_norm(x_BTD), *kv, None, cross_mask,
                                      self.rate, r_cross, fused)
            x_BTD = x_BTD + dropout(h_BTD, self.rate, r2)
        h_BTD = self.ffn_norm(x_BTD)
        if isinstance(self.ffn, SwitchFFN):      # padding (valid_BT false) is not routed
            h_BTD, stats = self.ffn(h_BTD, r_ffn, valid_BT)
        else:
            h_BTD, stats = self.ffn(h_BTD, r_ffn), {}
        x_BTD = x_BTD + dropout(h_BTD, self.rate, r3)
        return constrain(x_BTD, ("batch", "length", "d_model")), stats, cache


class Stack(nnx.Module):
    """Layers over embedded tokens, then the final norm (an encoder or a decoder).

    Unrolled (``layers``: one Block per layer) or, with ``cfg.scan_layers``, scanned:
    ``scanned[j]`` holds layer j of every repeating group of ``period`` layers, each parameter
    stacked along a leading 'layers' dim (layer g * period + j at index g), and training runs a
    lax.scan over the groups. Decoding with a cache runs layer by layer in both forms, over
    slices of the stacked weights, so the cache is the same per-layer list."""

    def __init__(self, cfg: ModelConfig, num_layers: int, causal: bool, cross: bool,
                 rngs: nnx.Rngs, encoder: bool = False):
        self.cfg, self.causal, self.num_layers = cfg, causal, num_layers
        self.relpos = RelativePositionBias(cfg.relpos_buckets, cfg.relpos_max_distance,
                                           cfg.num_heads, bidirectional=not causal, rngs=rngs)
        # Built unrolled in both forms, so a scanned model starts from the same weights.
        blocks = [Block(cfg, i, cross, rngs, encoder, causal) for i in range(num_layers)]
        if cfg.scan_layers:
            self.period = scan_period(cfg, num_layers, encoder)
            self.scanned = nnx.List([_stacked(blocks[j::self.period])
                                     for j in range(self.period)])
        else:
            self.layers = nnx.List(blocks)
        self.final_norm = RMSNorm(cfg.d_model)

    def __call__(self, x_BTD, positions_BT, segments_BT, enc_BSD=None, enc_segments_BS=None,
                 rng=None, cache=None, index=None, lengths_B=None, enc_lengths_B=None):
        """Segments mark packed sequences (0 = padding; None: one sequence per row, nothing
        masked but causality). ``lengths_B`` (and the encoder's ``enc_lengths_B``): rows hold
        one sequence each, right-padded to these lengths; attention then masks by length
        (Mask). Returns (x_BTD, Switch stats: a list of {name: [layers, ...]}, cache).

        With a cache (decoding), the tokens are the next ones after ``index`` cached positions;
        each attends to every valid cached position at or before its own."""
        if segments_BT is None:
            segments_BT = jnp.ones(x_BTD.shape[:2], jnp.int32) if cache is not None else None
        with jax.named_scope("masks"):
            mask, cross_mask, k_pos_BS, cache = masks.of_stack(
                x_BTD.shape[:2], self.causal, positions_BT, segments_BT, enc_segments_BS, cache,
                index, lengths_B, enc_lengths_B)
        valid_BT = (jnp.ones(x_BTD.shape[:2], bool) if segments_BT is None
                    else segments_BT != 0)
        if cache is None:
            # Training and evaluation: one bias [1, H, T, S] for all rows, from index positions;
            # its gradient sums over the batch, then (on a GPU or TPU) along the diagonals and
            # into the buckets (relpos.toeplitz_bias: no scatter over H.T.S). It equals the
            # per-row bias of positions_BT wherever the mask lets a query see a key: positions
            # are consecutive within each segment (layers.input_defaults checks them where
            # concrete), and across segments and padding the mask removes the entry. Decoding
            # keeps the per-row form. With the batch split over devices the batch sum is an
            # all-reduce of [H, T, S] per layer.
            bias_BHTS = self.relpos.of_indices(x_BTD.shape[1], x_BTD.shape[1])
        else:
            bias_BHTS = self.relpos(positions_BT, k_pos_BS)
        keys = None if rng is None else jax.random.split(rng, self.num_layers + 2)
        x_BTD = dropout(x_BTD, self.cfg.dropout, None if keys is None else keys[0])
        shared = (bias_BHTS, mask, enc_BSD, cross_mask)
        if cache is None and self.cfg.scan_layers:
            x_BTD, stats = self._scan(x_BTD, shared, valid_BT,
                                      None if keys is None else keys[2:])
        else:
            x_BTD, stats, cache = self._loop(x_BTD, shared, valid_BT,
                                             None if keys is None else keys[2:], cache, index)
        return (dropout(self.final_norm(x_BTD), self.cfg.dropout,
                        None if keys is None else keys[1]), stats, cache)

    def _loop(self, x_BTD, shared, valid_BT, keys, cache, index):
        """Layer by layer (unrolled training, and decoding in both forms)."""
        policy = REMAT_POLICIES[self.cfg.remat] if cache is None else None   # decoding: no grads
        stats, layer_caches = [], []
        for i, layer in enumerate(self.blocks()):
            c = None if cache is None else cache["layers"][i]
            x_BTD, s, c = _remat(layer, policy)(x_BTD, *shared, None if keys is None else keys[i],
                                                valid_BT, c, index)
            layer_caches.append(c)
            if s:
                stats.append({k: v[None] for k, v in s.items()})
        if cache is not None:
            cache = {**cache, "layers": layer_caches}
        return x_BTD, stats, cache

    def _scan(self, x_BTD, shared, valid_BT, keys):
        """A lax.scan over the groups of ``period`` layers, each group one (rematerialised)
        body; with a stage axis in the layout, the groups pipelined over it
        (switchzoo/pipeline.py). The stats come back in layer order: {name: [sparse layers,
        ...]}."""
        graphdef, params = nnx.split(self.scanned)
        groups = self.num_layers // self.period
        group_keys = (None if keys is None                  # typed keys, or raw [n, 2]
                      else keys.reshape((groups, self.period) + keys.shape[1:]))
        bias_BHTS, *rows = shared                          # rows: per batch row
        rows = (*rows, valid_BT)
        policy = REMAT_POLICIES[self.cfg.remat]

        def run(x_BTD, rows, bias_BHTS, params, keys, select=None):
            """Consecutive groups over x (their parameters stacked on the leading dim; a
            pipeline's ``select`` picks each group's from its slice)."""
            mask, enc_BSD, cross_mask, valid_BT = rows

            def group(x_BTD, xs):
                params, keys = xs
                if select is not None:
                    params = select(params)
                stats = []
                for j, layer in enumerate(nnx.merge(graphdef, params)):
                    x_BTD, s, _ = layer(x_BTD, bias_BHTS, mask, enc_BSD, cross_mask,
                                        None if keys is None else keys[j], valid_BT)
                    if s:
                        stats.append(s)
                return x_BTD, stats

            if policy is not None:
                group = jax.checkpoint(group, policy=policy, prevent_cse=False)
            return jax.lax.scan(group, x_BTD, (params, keys))

        plan = pipeline.plan(active(), self.cfg)
        if plan is None:
            x_BTD, stats = run(x_BTD, rows, bias_BHTS, params, group_keys)
        else:
            x_BTD, stats = pipeline.run(plan, active(), run, x_BTD, rows, bias_BHTS, params,
                                        group_keys)
        if not stats:
            return x_BTD, []
        # [groups, sparse per group, ...] -> [sparse layers, ...]: layer g * period + j in order.
        return x_BTD, [{k: jnp.stack([s[k] for s in stats], 1).reshape(
            (-1,) + stats[0][k].shape[1:]) for k in stats[0]}]

    def blocks(self) -> list[Block]:
        """Every layer as a Block, in order (in the scanned form, slices of the stacked
        weights)."""
        if not self.cfg.scan_layers:
            return list(self.layers)
        parts = [nnx.split(m) for m in self.scanned]
        return [nnx.merge(graphdef, jax.tree.map(lambda x, g=g: x[g], params))
                for g in range(self.num_layers // self.period) for graphdef, params in parts]

    def init_cache(self, batch: int, max_length: int, enc_BSD=None, dtype=jnp.float32) -> dict:
        """An empty decoding cache (with the cross-attention keys/values of ``enc_BSD``)."""
        shape = (batch, self.cfg.num_heads, max_length, self.cfg.d_kv)
        layers = []
        for layer in self.blocks():
            c = {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
            if layer.has_cross:
                c["cross_k"], c["cross_v"] = layer.cross.project_kv(enc_BSD)
            layers.append(c)
        return {"valid": jnp.zeros((batch, max_length), bool), "layers": layers}


class _Head(nnx.Module):
    """Shared embedding and output layer: tied (scaled by d_model**-0.5) or a separate matrix."""

    def _init_head(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = Embed(cfg.vocab_size, cfg.d_model, rngs)
        if not cfg.tie_embeddings:
            self.lm_head = Init.of(cfg).matrix(rngs, cfg.d_model, (cfg.d_model, cfg.vocab_size),
                                               ("d_model", "vocab"))

    @jax.named_scope("logits")
    def _logits(self, x_BLD, head_DV=None):
        if head_DV is not None:         # decoding: the output layer as head_DV() gave it
            scale = self.cfg.d_model ** -0.5 if self.cfg.tie_embeddings else 1.0
            logits_BLV = jnp.einsum("BLD,DV->BLV", x_BLD * scale, head_DV.astype(x_BLD.dtype))
            logits_BLV = constrain(logits_BLV, ("batch", "length", "vocab"))
        elif self.cfg.tie_embeddings:
            logits_BLV = self.embed.attend(x_BLD * self.cfg.d_model ** -0.5)
        else:
            logits_BLV = jnp.einsum("BLD,DV->BLV", x_BLD, self.lm_head[...].astype(x_BLD.dtype))
            logits_BLV = constrain(logits_BLV, ("batch", "length", "vocab"))
        return logits_BLV.astype(jnp.float32)

    def head_inputs(self, x_BLD):
        """The output layer as (x_BLD, w_VD) with logits_BLV = x_BLD @ w_VD^T, for a loss that
        makes the logits itself a chunk at a time (switchzoo.loss): tied, the final hidden
        states scaled by d_model**-0.5 and the embedding; untied, lm_head transposed. w_VD is in
        the parameters' dtype (the loss casts it to x's for its matmuls, as _logits does)."""
        if self.cfg.tie_embeddings:
            return x_BLD * self.cfg.d_model ** -0.5, self.embed.embedding[...]
        return x_BLD, self.lm_head[...].T

    def head_DV(self):
        """The output layer as [d_model, vocab], for a decoding loop to take once before it
        and pass to every ``decode``: a few rows against the tied embedding read as stored,
        [V, D], make XLA:CPU's matmul repack it at every step (13% of a greedy step at the
        peer config, docs/benchmarks.md), so it is transposed once, here. Untied: lm_head."""
        if self.cfg.tie_embeddings:
            return jax.lax.optimization_barrier(self.embed.embedding[...].T)
        return self.lm_head[...]

    def decode(self, ids_BT, cache: dict, index, segments_BT=None, enc_segments_BS=None,
               head_DV=None):
        """Logits of the next tokens given the cache; returns (logits [B, T, V], cache).
        The tokens sit at positions index .. index+T-1. ``head_DV``: the output layer as
        ``head_DV()`` gives it (a loop takes it once), else the model's own."""
        B, T = ids_BT.shape
        positions_BT = jnp.broadcast_to(index + jnp.arange(T), (B, T))
        if segments_BT is None:
            segments_BT = jnp.ones((B, T), jnp.int32)
        x_BTD = self.embed(ids_BT, jnp.dtype(self.cfg.dtype))
        x_BTD, _, cache = self.decoder(x_BTD, positions_BT, segments_BT,
                                       enc_segments_BS=enc_segments_BS, cache=cache, index=index)
        return self._logits(x_BTD, head_DV), cache


class DecoderLM(_Head):
    """Decoder-only language model (a T5 decoder without cross-attention)."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self._init_head(cfg, rngs)
        self.decoder = Stack(cfg, cfg.num_layers, causal=True, cross=False, rngs=rngs)

    def __call__(self, ids_BL, *, positions_BL=None, segments_BL=None, lengths_B=None, rng=None,
                 return_hidden=False):
        """Returns float32 logits [B, L, V] and the Switch losses/metrics (see ``moe.combine_losses``).
        ``rng`` None means evaluation (no dropout or jitter, the eval capacity factor).
        ``lengths_B``: each row one sequence of that many tokens, then padding (its segments,
        if given, 1 then 0); the attention then masks by length (Stack).
        ``return_hidden``: the final hidden states x_BLD in place of the logits (head_inputs)."""
        positions_BL = layers.input_defaults(ids_BL, positions_BL, segments_BL)
        x_BLD = self.embed(ids_BL, jnp.dtype(self.cfg.dtype))
        x_BLD, stats, _ = self.decoder(x_BLD, positions_BL, segments_BL, rng=rng,
                                       lengths_B=lengths_B)
        return (x_BLD if return_hidden else self._logits(x_BLD),
                moe.combine_losses([stats], _reduction(self.cfg)))

    def init_cache(self, batch: int, max_length: int) -> dict:
        return self.decoder.init_cache(batch, max_length)


class EncoderDecoder(_Head):
    """The T5 / Switch Transformer encoder-decoder."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self._init_head(cfg, rngs)
        self.encoder = Stack(cfg, cfg.num_encoder_layers, causal=False, cross=False, rngs=rngs,
                             encoder=True)
        self.decoder = Stack(cfg, cfg.num_layers, causal=True, cross=True, rngs=rngs)

    def encode(self, src_BS, *, positions_BS=None, segments_BS=None, lengths_B=None, rng=None):
        """Encoder output [B, S, D] and the encoder's Switch stats (``lengths_B``: as in
        __call__'s ``src_lengths``)."""
        positions_BS = layers.input_defaults(src_BS, positions_BS, segments_BS)
        x_BSD = self.embed(src_BS, jnp.dtype(self.cfg.dtype))
        x_BSD, stats, _ = self.encoder(x_BSD, positions_BS, segments_BS, rng=rng,
                                       lengths_B=lengths_B)
        return x_BSD, stats

    def __call__(self, src_BS, tgt_BT, *, src_positions=None, src_segments=None,
                 tgt_positions=None, tgt_segments=None, src_lengths=None, tgt_lengths=None,
                 rng=None, return_hidden=False):
        """Source ids [B, S] and decoder input ids [B, T] (targets shifted right) -> float32
        logits [B, T, V] (``return_hidden``: the decoder's final hidden states [B, T, D]) and
        the Switch losses/metrics of both stacks. ``src_lengths`` / ``tgt_lengths`` [B]: each
        row one sequence of that many tokens, then padding; attention then masks by length
        (both are needed for the decoder's; either alone masks its own stack)."""
        r_enc, r_dec = split(rng, 2)
        src_positions = layers.input_defaults(src_BS, src_positions, src_segments)
        tgt_positions = layers.input_defaults(tgt_BT, tgt_positions, tgt_segments)
        enc_BSD, enc_stats = self.encode(src_BS, positions_BS=src_positions,
                                         segments_BS=src_segments, lengths_B=src_lengths,
                                         rng=r_enc)
        y_BTD = self.embed(tgt_BT, jnp.dtype(self.cfg.dtype))
        y_BTD, dec_stats, _ = self.decoder(y_BTD, tgt_positions, tgt_segments, enc_BSD,
                                           src_segments, rng=r_dec, lengths_B=tgt_lengths,
                                           enc_lengths_B=src_lengths)
        return (y_BTD if return_hidden else self._logits(y_BTD),
                moe.combine_losses([enc_stats, dec_stats], _reduction(self.cfg)))

    def init_cache(self, batch: int, max_length: int, enc_BSD) -> dict:
        return self.decoder.init_cache(batch, max_length, enc_BSD)


def _reduction(cfg: ModelConfig) -> str:
    return cfg.moe.loss_reduction if cfg.moe is not None else "sum"


def build(cfg: ModelConfig, seed: int = 0) -> DecoderLM | EncoderDecoder:
    cls = EncoderDecoder if cfg.is_encoder_decoder else DecoderLM
    return cls(cfg, nnx.Rngs(params=seed))
