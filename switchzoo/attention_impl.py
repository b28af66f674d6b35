"""How a model's attention runs: the one place ``ModelConfig.attention`` ("auto", "reference",
"xla", "cudnn", "pallas") is resolved for a backend, with the reason, and the fused kernels'
compile probes. switchzoo.layers.Attention runs the implementation chosen here."""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp


# What cuDNN is given (switchzoo.layers.Mask): causality and right padding as its own masks; a
# packed batch's segments only as a boolean mask, which JAX adds to the bias, so the kernel
# then reads and writes a [B, H, T, S] bias: jax.nn.dot_product_attention (JAX 0.10) has no
# public segment-id or offset argument.
PACKED = ("; packed rows (segments) reach it as a mask JAX adds to the bias ([B, H, T, S]): "
          "JAX has no public segment path")


class AttentionImpl(NamedTuple):
    """How a model's attention runs: ``name`` "reference" (the einsums of Attention.attend),
    "xla" or "cudnn" (jax.nn.dot_product_attention's implementations) or "pallas" (JAX's
    flash-attention kernel for TPUs), and why. ``strict``: asked for by name, so a call it
    cannot serve is an error rather than the reference path (cuDNN and Pallas; "xla" falls
    back like "auto")."""
    name: str
    reason: str
    strict: bool = False

    def __str__(self):
        return f"{self.name} ({self.reason})"


def attention_impl(cfg, backend: str | None = None) -> AttentionImpl:
    """ModelConfig.attention resolved for ``backend`` (default: JAX's): the one place "auto" is
    decided. Auto is cuDNN's fused kernel on a GPU with bfloat16/float16 activations whose head
    width it takes and where it compiles (a small probe, once per process), else the reference
    path. Either way, calls the fused kernel cannot serve run the reference path (attention
    dropout in training, decoding against a cache: Attention.attend)."""
    backend = backend or jax.default_backend()
    if cfg.attention == "reference":
        return AttentionImpl("reference", "asked for")
    if cfg.attention == "xla":
        impl = AttentionImpl("xla", "jax.nn.dot_product_attention, implementation='xla'")
    elif cfg.attention == "pallas" or (cfg.attention == "auto" and backend == "tpu"):
        if backend != "tpu":
            raise ValueError(f"attention='pallas' cannot run here: {backend} backend: the "
                             "Pallas flash-attention kernel runs on TPUs; set attention "
                             "(--config.attention) to auto, xla or reference")
        failed = _pallas_probe(cfg.dtype, cfg.num_heads, cfg.d_kv)
        if failed and cfg.attention == "pallas":
            raise ValueError(f"attention='pallas' did not compile here: {failed}; set "
                             "attention (--config.attention) to auto, xla or reference")
        if failed:
            return AttentionImpl("reference", f"the Pallas flash kernel did not compile: "
                                              f"{failed}")
        impl = AttentionImpl("pallas", "Pallas flash attention" + (
            ", asked for" if cfg.attention == "pallas" else ""),
            strict=cfg.attention == "pallas")
    else:
        why = _cudnn_refusal(cfg, backend)
        if cfg.attention == "cudnn" and why:
            raise ValueError(f"attention='cudnn' cannot run here: {why}; set attention "
                             "(--config.attention) to auto, xla or reference")
        if why:
            return AttentionImpl("reference", why)
        if cfg.attention == "cudnn":
            impl = AttentionImpl("cudnn", "fused, asked for" + PACKED, strict=True)
        else:
            failed = _cudnn_probe(cfg.dtype, cfg.num_heads, cfg.d_kv)
            if failed:
                return AttentionImpl("reference", f"cuDNN's fused kernel did not compile: "
                                                  f"{failed}")
            impl = AttentionImpl("cudnn", "fused" + PACKED)
    if cfg.dropout > 0:
        impl = impl._replace(reason=f"{impl.reason}; training steps run the reference path "
                                    f"for attention dropout (dropout={cfg.dropout:g})")
    return impl


@functools.lru_cache
def _pallas_probe(dtype: str, heads: int, d_kv: int) -> str:
    """'' if the Pallas flash kernel compiles forward and backward with a bias on small shapes
    (128 queries and keys: its block size), else the first line of the error."""
    shape = jax.ShapeDtypeStruct((1, heads, 128, d_kv), jnp.dtype(dtype))

    def loss(q, k, v, bias):
        return jnp.sum(flash(q, k, v, bias, causal=True).astype(jnp.float32))
    return _compile_error(loss, shape, shape, shape,
                          jax.ShapeDtypeStruct((1, heads, 128, 128), jnp.float32))


def _compile_error(loss, *shapes) -> str:
    """'' if the gradient of ``loss`` with respect to every argument compiles for ``shapes``,
    else the first line of the error (any refusal: the caller keeps the reference path)."""
    try:
        jax.jit(jax.grad(loss, argnums=tuple(range(len(shapes))))).lower(*shapes).compile()
    except Exception as e:          # noqa: BLE001
        return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
    return ""


def flash(q_BHTK, k_BHSK, v_BHSK, bias_BHTS, causal: bool):
    """JAX's Pallas flash attention for TPUs (blocks of 128 queries and keys); its backward
    gives the bias's gradient too."""
    from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention
    return flash_attention(q_BHTK, k_BHSK, v_BHSK, bias_BHTS, causal=causal, sm_scale=1.0)


def _cudnn_refusal(cfg, backend: str) -> str:
    """Why cuDNN's fused kernel cannot serve ``cfg`` on ``backend`` ('' if it can): it runs on
    NVIDIA GPUs, in bfloat16/float16, heads of a multiple of 8 up to 128 wide (256 on Hopper
    and later). jax/_src/cudnn/fused_attention_stablehlo.py: check_layout and
    check_is_flash_attention."""
    if backend != "gpu":
        return f"{backend} backend: cuDNN's fused kernel runs on NVIDIA GPUs"
    if cfg.dtype not in ("bfloat16", "float16"):
        return f"{cfg.dtype} activations: cuDNN's fused kernel takes bfloat16 or float16"
    capability = getattr(jax.devices(backend)[0], "compute_capability", "0.0")
    widest = 256 if tuple(int(x) for x in capability.split(".")[:2]) >= (9, 0) else 128
    if cfg.d_kv % 8 or cfg.d_kv > widest:
        return (f"d_kv={cfg.d_kv}: cuDNN's fused kernel takes a multiple of 8 up to {widest} "
                "on this GPU")
    return ""


@functools.lru_cache
def _cudnn_probe(dtype: str, heads: int, d_kv: int) -> str:
    """'' if cuDNN compiles the forward and backward of both attentions a model runs on small
    shapes (self: relative-position bias [1, H, T, S], mask, causal; cross: key lengths only,
    S != T),
    else the first line of its error: auto then keeps the reference path rather than fail the
    run (a missing cuDNN, an unsupported GPU or bias gradient)."""
    dt = jnp.dtype(dtype)
    B, T, S = 2, 16, 32

    def loss(q, k, v, kx, vx, bias):
        mask = jnp.ones((B, 1, T, T), bool).at[:, :, :, T // 2:].set(False)
        self_ = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=1.0,
                                             is_causal=True, implementation="cudnn")
        cross = jax.nn.dot_product_attention(
            q, kx, vx, key_value_seq_lengths=jnp.full((B,), S // 2, jnp.int32), scale=1.0,
            implementation="cudnn")
        return jnp.sum((self_ + cross).astype(jnp.float32))
    qkv = jax.ShapeDtypeStruct((B, T, heads, d_kv), dt)
    kvx = jax.ShapeDtypeStruct((B, S, heads, d_kv), dt)
    return _compile_error(loss, qkv, qkv, qkv, kvx, kvx,
                          jax.ShapeDtypeStruct((1, heads, T, T), dt))
