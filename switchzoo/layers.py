"""Named-dimension building blocks: embeddings, RMSNorm, T5 attention with relative-position
bias, and the feed-forward MLP (``mlp``) that the dense block and every expert share. Every
parameter carries ``dims`` metadata from switchzoo.dims; key activations are pinned with
``layout.constrain``. Shapes live in the suffixes (``x_BLD``)."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from switchzoo.attention_impl import flash
from switchzoo.masks import Mask
from switchzoo.draws import param
from switchzoo.layout import constrain

NEG_INF = -1e9
# The activations the "minimal" remat policy keeps (transformer.REMAT_POLICIES), tagged with
# jax.ad_checkpoint.checkpoint_name where they are made: the attention's projections and its
# context (per head, before the output projection), the feed-forward projections (dense and
# expert: mlp's). MaxText's minimal_with_context.
MINIMAL_SAVED = ("query_proj", "key_proj", "value_proj", "context", "out_proj", "mlpwi",
                 "mlpwi_0", "mlpwi_1", "mlpwo")


# cuDNN's fused forward (the primitive jax.nn.dot_product_attention binds): its outputs are the
# context and the softmax statistics [B, H, T] its backward reads. The "minimal" policy saves
# them, so a layer's backward does not run the fused forward again.
CUDNN_FORWARD = "dot_product_attention_fwd_wrapper"


def minimal_policy():
    """The "minimal" remat policy: MINIMAL_SAVED by name, and cuDNN's forward outputs."""
    names = jax.checkpoint_policies.save_only_these_names(*MINIMAL_SAVED)

    def policy(prim, *args, **params):
        return prim.name == CUDNN_FORWARD or names(prim, *args, **params)
    return policy


class Init(NamedTuple):
    """How weight matrices start: std sqrt(scale / fan-in), from a normal or a truncated normal
    (Switch Transformer sec. 2.4: scale 0.1, truncated; T5: 1.0, normal). ModelConfig's
    init_scale / init_distribution."""
    scale: float = 1.0
    truncated: bool = False

    @classmethod
    def of(cls, cfg) -> "Init":
        return cls(cfg.init_scale, cfg.init_distribution == "truncated_normal")

    def matrix(self, rngs: nnx.Rngs, fan_in: int, shape, dims, extra: float = 1.0) -> nnx.Param:
        """A weight matrix whose inputs number ``fan_in``, std sqrt(scale / fan_in) x
        ``extra``."""
        return param(rngs, (self.scale / fan_in) ** 0.5 * extra, shape, dims,
                     truncated=self.truncated)


def dropout(x, rate: float, rng):
    """Inverted dropout; identity when ``rng`` is None (evaluation) or ``rate`` is 0."""
    if rng is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


def split(rng, n: int):
    return [None] * n if rng is None else list(jax.random.split(rng, n))


class Embed(nnx.Module):
    def __init__(self, vocab: int, d_model: int, rngs: nnx.Rngs):
        self.embedding = param(rngs, 1.0, (vocab, d_model), ("vocab", "d_model"))

    @jax.named_scope("embed")
    def __call__(self, ids_BL, dtype):
        x_BLD = jnp.take(self.embedding[...], ids_BL, axis=0).astype(dtype)
        return constrain(x_BLD, ("batch", "length", "d_model"))

    def attend(self, x_BLD):
        """Logits through the transposed embedding (tied output layer)."""
        logits_BLV = jnp.einsum("BLD,VD->BLV", x_BLD, self.embedding[...].astype(x_BLD.dtype))
        return constrain(logits_BLV, ("batch", "length", "vocab"))


class RMSNorm(nnx.Module):
    """T5 layer norm: scale only, no mean subtraction, no bias; computed in float32."""

    def __init__(self, d_model: int, eps: float = 1e-6):
        self.scale = nnx.Param(jnp.ones((d_model,), jnp.float32), dims=("d_model",))
        self.eps = eps

    @jax.named_scope("norm")
    def __call__(self, x_BLD):
        x = x_BLD.astype(jnp.float32)
        x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return (x * self.scale[...]).astype(x_BLD.dtype)


class Attention(nnx.Module):
    """Multi-head attention without biases or 1/sqrt(d_kv) (T5 folds it into the query's
    init, as flaxformer does: its std is the others' / sqrt(d_kv)). ``impl`` (an
    AttentionImpl's name; ``strict``: asked for by name) says how it runs, ``causal`` whether
    its mask is causal (then the fused kernels are told so: cuDNN skips the masked blocks)."""

    def __init__(self, d_model: int, heads: int, d_kv: int, rngs: nnx.Rngs,
                 init: Init = Init(), impl: str = "reference", causal: bool = False,
                 strict: bool = False):
        qkv = (d_model, heads, d_kv), ("d_model", "heads", "d_kv")
        self.q = init.matrix(rngs, d_model, *qkv, extra=d_kv ** -0.5)
        self.k = init.matrix(rngs, d_model, *qkv)
        self.v = init.matrix(rngs, d_model, *qkv)
        self.o = init.matrix(rngs, heads * d_kv, (heads, d_kv, d_model),
                             ("heads", "d_kv", "d_model"))
        self.impl, self.causal, self.strict = impl, causal, strict

    def __call__(self, x_BTD, kv_BSD, bias_BHTS, mask, rate: float = 0.0, rng=None):
        return self.attend(x_BTD, *self.project_kv(kv_BSD), bias_BHTS, mask, rate, rng)

    @jax.named_scope("attention")
    def project_kv(self, kv_BSD):
        """Keys and values [B, H, S, K] (what a decoding cache stores): heads-major, the layout
        the attention matmuls batch over, so a cached step reads them without a transpose."""
        dt = kv_BSD.dtype
        # [B, S, H, K] then heads-major: a dot whose output keeps the weight's order, so XLA
        # reads the weight as it is stored (an output in [B, H, S, K] order had XLA:CPU copy
        # the weight into [H, K, D] at every use, inside decoding's loop too)
        k_BHSK = jnp.swapaxes(jnp.einsum("BSD,DHK->BSHK", kv_BSD, self.k[...].astype(dt)), 1, 2)
        v_BHSK = jnp.swapaxes(jnp.einsum("BSD,DHK->BSHK", kv_BSD, self.v[...].astype(dt)), 1, 2)
        return (checkpoint_name(constrain(k_BHSK, ("batch", "heads", "length", "d_kv")),
                                "key_proj"),
                checkpoint_name(constrain(v_BHSK, ("batch", "heads", "length", "d_kv")),
                                "value_proj"))

    @jax.named_scope("attention")
    def attend(self, x_BTD, k_BHSK, v_BHSK, bias_BHTS, mask, rate: float = 0.0, rng=None,
               fused: bool = True):
        """Queries x_BTD attend to keys/values [B, H, S, K] with ``bias_BHTS`` (float32,
        [B or 1, H, T, S], or None) where ``mask`` (a Mask, a boolean [B, T, S] or None) and,
        in a causal stack, causality allow. ``fused`` False (decoding against a cache: the
        mask holds causality by position) runs the reference path whatever ``impl`` says."""
        mask = Mask.of(mask)
        impl = self._serving(x_BTD.shape[1], k_BHSK.shape[2], rate, rng) if fused else None
        if impl == "pallas":
            return self._flash(x_BTD, k_BHSK, v_BHSK, bias_BHTS, mask)
        if impl in ("xla", "cudnn"):
            return self._fused(impl, x_BTD, k_BHSK, v_BHSK, bias_BHTS, mask)
        q_BHTK = self._query(x_BTD)
        s_BHTS = jnp.einsum("BHTK,BHSK->BHTS", q_BHTK, k_BHSK).astype(jnp.float32)
        if bias_BHTS is not None:
            s_BHTS = s_BHTS + _rows(bias_BHTS, s_BHTS.shape[0])
        keep = mask.dense(s_BHTS.shape[2], s_BHTS.shape[3], self.causal and fused)
        if keep is not None:
            s_BHTS = s_BHTS + jnp.where(keep[:, None], 0.0, NEG_INF)
        p_BHTS = dropout(jax.nn.softmax(s_BHTS, axis=-1).astype(x_BTD.dtype), rate, rng)
        return self._out(checkpoint_name(jnp.einsum("BHTS,BHSK->BHTK", p_BHTS, v_BHSK),
                                         "context"))

    def _query(self, x_BTD):
        """The queries [B, H, T, K] of the reference and flash paths (tagged for remat)."""
        q_BHTK = jnp.swapaxes(jnp.einsum("BTD,DHK->BTHK", x_BTD, self.q[...].astype(x_BTD.dtype)),
                              1, 2)
        return checkpoint_name(constrain(q_BHTK, ("batch", "heads", "length", "d_kv")),
                               "query_proj")

    def _out(self, ctx_BHTK):
        """The output projection of a context [B, H, T, K] (tagged for remat)."""
        out_BTD = jnp.einsum("BHTK,HKD->BTD", ctx_BHTK, self.o[...].astype(ctx_BHTK.dtype))
        return checkpoint_name(constrain(out_BTD, ("batch", "length", "d_model")), "out_proj")

    def _serving(self, T: int, S: int, rate: float, rng) -> str:
        """The implementation that serves this call: ``impl``, or the reference path where
        the fused kernels cannot (an error where cuDNN was asked for by name)."""
        if self.impl == "reference":
            return "reference"
        why = fix = ""
        if rate > 0 and rng is not None:
            why, fix = f"attention dropout (rate {rate:g} in a training step)", "dropout=0"
        elif self.impl == "cudnn" and (T % 2 or S % 2):
            why, fix = f"odd lengths ({T} queries, {S} keys)", "even lengths"
        elif self.impl == "pallas" and (T % 128 or S % 128):
            why, fix = (f"lengths that are not multiples of 128 ({T} queries, {S} keys)",
                        "lengths that are multiples of 128")
        if not why:
            return self.impl
        if self.strict:
            raise ValueError(f"attention={self.impl!r} cannot serve {why}; use {fix}, or set "
                             "attention (--config.attention) to auto, which runs such calls on "
                             "the reference path")
        return "reference"

    def _flash(self, x_BTD, k_BHSK, v_BHSK, bias_BHTS, mask: Mask):
        """The Pallas flash kernel (TPU): the kernel takes one bias per row and head, so the
        mask joins the bias as NEG_INF (as the reference adds it); causal attention also
        skips the blocks above the diagonal."""
        q_BHTK = self._query(x_BTD)
        B, H, T, S = q_BHTK.shape[0], q_BHTK.shape[1], q_BHTK.shape[2], k_BHSK.shape[2]
        bias, keep = None, mask.dense(T, S, False)
        if keep is not None:
            bias = jnp.broadcast_to(jnp.where(keep[:, None], 0.0, NEG_INF), (B, H, T, S))
        if bias_BHTS is not None:
            rows = _rows(bias_BHTS.astype(jnp.float32), B)
            bias = rows if bias is None else bias + rows
        ctx_BHTK = flash(q_BHTK, k_BHSK, v_BHSK, bias, self.causal)
        return self._out(checkpoint_name(
            constrain(ctx_BHTK, ("batch", "heads", "length", "d_kv")), "context"))

    def _fused(self, impl: str, x_BTD, k_BHSK, v_BHSK, bias_BHTS, mask: Mask):
        """jax.nn.dot_product_attention (layout [B, T, heads, d_kv]; scale 1: T5 folds it into
        the query weights). Causality and right padding go as its ``is_causal`` and sequence
        lengths (cuDNN's causal and padding masks: no tensor); a boolean keep_BTS goes as
        ``mask`` [B, 1, T, S], which XLA applies with a where (a fully masked row, padding's
        cross-attention, averages its values: no NaN) and cuDNN adds to the bias as a large
        negative number. cuDNN takes the bias [1, H, T, S] (its gradient, too, is one per
        head: never [B, H, T, S] unless a mask joins it) in the activations' dtype (a float32
        one NaNs its bias gradient, jax issue 32242)."""
        dt = x_BTD.dtype
        q_BTHK = jnp.einsum("BTD,DHK->BTHK", x_BTD, self.q[...].astype(dt))
        q_BTHK = checkpoint_name(constrain(q_BTHK, ("batch", "length", "heads", "d_kv")),
                                 "query_proj")
        k_BSHK, v_BSHK = (jnp.swapaxes(t, 1, 2) for t in (k_BHSK, v_BHSK))
        if bias_BHTS is None:
            bias = None
        elif impl == "cudnn":       # [1, H, T, S]: the bias whose gradient cuDNN computes
            bias = bias_BHTS.astype(dt)
        else:
            bias = _rows(bias_BHTS, x_BTD.shape[0])
        ctx_BTHK = jax.nn.dot_product_attention(
            q_BTHK, k_BSHK, v_BSHK, bias=bias,
            mask=None if mask.keep_BTS is None else mask.keep_BTS[:, None],
            scale=1.0, is_causal=self.causal, query_seq_lengths=_lengths(mask.q_lengths_B),
            key_value_seq_lengths=_lengths(mask.kv_lengths_B), implementation=impl)
        ctx_BTHK = checkpoint_name(constrain(ctx_BTHK, ("batch", "length", "heads", "d_kv")),
                                   "context")
        out_BTD = jnp.einsum("BTHK,HKD->BTD", ctx_BTHK, self.o[...].astype(dt))
        return checkpoint_name(constrain(out_BTD, ("batch", "length", "d_model")), "out_proj")


def _lengths(lengths_B):
    return None if lengths_B is None else lengths_B.astype(jnp.int32)


def _rows(bias_BHTS, B: int):
    """A bias shared by the rows ([1, H, T, S]) as one per row: an outer product with ones, so
    its gradient sums the rows by a dot, which XLA:CPU runs ~35x faster than the reduce that
    a broadcast's transpose is ([8, 8, 512, 512]: 0.005 s against 0.18 s of CPU)."""
    if bias_BHTS.shape[0] == B:
        return bias_BHTS
    return jnp.einsum("B,HTS->BHTS", jnp.ones((B,), bias_BHTS.dtype), bias_BHTS[0])


def ffn_params(rngs: nnx.Rngs, d_model: int, d_ff: int, activation: str,
               experts: int = 0, init: Init = Init()) -> dict[str, nnx.Param]:
    """The weights of one feed-forward block (``experts`` > 0: one block per expert, stacked
    along a leading 'experts' dim; each expert's fan-in is its own): wi, or wi_0 and wi_1 when
    gated; then wo."""
    lead, lead_dims = ((experts,), ("experts",)) if experts else ((), ())
    names = ("wi_0", "wi_1") if activation == "gated-gelu" else ("wi",)
    out = {name: init.matrix(rngs, d_model, lead + (d_model, d_ff),
                             lead_dims + ("d_model", "d_ff")) for name in names}
    out["wo"] = init.matrix(rngs, d_ff, lead + (d_ff, d_model), lead_dims + ("d_ff", "d_model"))
    return out


FFN_WEIGHTS = ("wi", "wi_0", "wi_1", "wo")


def ffn_weights(module: nnx.Module) -> dict:
    """{name: value} of the feed-forward weights a module holds (made by ``ffn_params``)."""
    return {k: getattr(module, k)[...] for k in FFN_WEIGHTS if hasattr(module, k)}


def mlp(x, w: dict, project, hidden=lambda h: h, dropout_fn=lambda h: h):
    """The one feed-forward computation: relu(x wi) wo, or T5 v1.1's gated GELU,
    (gelu(x wi_0) * x wi_1) wo. The dense block and both Switch dispatches differ only in
    ``project(x, weight)``, the matmul of their layout (one weight for every token, a batch of
    per-expert weights, or a matmul grouped by expert); ``hidden`` pins the hidden activation
    (layout.constrain) before ``dropout_fn``."""
    def proj(x, name):          # tagged for the "minimal" remat policy (MINIMAL_SAVED)
        return checkpoint_name(project(x, w[name]), f"mlp{name}")
    if "wi" in w:
        h = jax.nn.relu(proj(x, "wi"))
    else:
        h = jax.nn.gelu(proj(x, "wi_0"), approximate=True) * proj(x, "wi_1")
    return proj(dropout_fn(hidden(h)), "wo")


class Mlp(nnx.Module):
    """Dense feed-forward block: ReLU, or gated GELU (T5 v1.1), dropout ``rate`` inside."""

    def __init__(self, d_model: int, d_ff: int, rngs: nnx.Rngs, activation: str = "relu",
                 rate: float = 0.0, init: Init = Init()):
        for name, value in ffn_params(rngs, d_model, d_ff, activation, init=init).items():
            setattr(self, name, value)
        self.rate = rate

    @jax.named_scope("mlp")
    def __call__(self, x_BLD, rng=None):
        def project(x, w):          # [B, L, in] x [in, out]
            return jax.lax.dot_general(x, w.astype(x.dtype), (((2,), (0,)), ((), ())))

        y_BLD = mlp(x_BLD, ffn_weights(self), project,
                    hidden=lambda h: constrain(h, ("batch", "length", "d_ff")),
                    dropout_fn=lambda h: dropout(h, self.rate, rng))
        return constrain(y_BLD, ("batch", "length", "d_model"))


def input_defaults(ids_BL, positions_BL, segments_BL):
    """The positions: 0, 1, ... where none are given; given ones must be consecutive within
    each segment (one per row where ``segments_BL`` is None), as packing gives them, since the
    relative-position bias and the causal mask read token order: checked wherever they are
    concrete (under jit, the caller's promise)."""
    B, L = ids_BL.shape
    if positions_BL is None:
        return jnp.broadcast_to(jnp.arange(L), (B, L))
    if not isinstance(positions_BL, jax.core.Tracer) and not isinstance(segments_BL,
                                                                        jax.core.Tracer):
        check_positions(np.asarray(positions_BL), np.ones((B, L), np.int32)
                        if segments_BL is None else np.asarray(segments_BL))
    return positions_BL


def check_positions(positions_BL: np.ndarray, segments_BL: np.ndarray) -> None:
    """A ValueError naming the first token whose position is not its segment's first position
    plus its distance from that token (padding, segment 0, is not checked)."""
    offset_BL = positions_BL - np.arange(positions_BL.shape[1])
    for b in range(positions_BL.shape[0]):
        for segment in np.unique(segments_BL[b][segments_BL[b] != 0]):
            where = np.flatnonzero(segments_BL[b] == segment)
            bad = np.flatnonzero(offset_BL[b, where] != offset_BL[b, where[0]])
            if bad.size:
                t = int(where[bad[0]])
                raise ValueError(
                    f"positions are not consecutive within segment {segment} of row {b}: token "
                    f"{t} has position {positions_BL[b, t]}, not "
                    f"{positions_BL[b, where[0]] + t - where[0]}; the relative-position bias "
                    "reads token order, so give each packed segment positions n, n+1, ... "
                    "(or none: 0, 1, ... per row)")
