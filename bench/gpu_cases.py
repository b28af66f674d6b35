"""The cases of bench/gpu.py (the train steps: bench/gpu_train.py), each run in its own
process: ``case(rec, z, args)`` fills ``rec`` (a dict saved to disk on every change, so a case
cut off by its time limit still leaves what it measured) at the sizes ``z`` (SIZES["full"] or
SIZES["smoke"]); ``args``: gpu.py's flags.

A measurement of an option this tree does not have (a model field, a dispatch, a remat policy
or a step argument another change adds) is recorded as ``unsupported`` with the error that
said so, and the case goes on.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import math
import time
import traceback
from pathlib import Path
from types import SimpleNamespace as NS

from common import best_of, machine, matmul_peak

# Dense bf16 matmul FLOP/s from the vendors' spec sheets (no sparsity), keyed by JAX's
# device_kind; an unknown device gets no spec-sheet MFU.
SPEC_BF16_FLOPS = {"NVIDIA H100 80GB HBM3": 989e12, "NVIDIA H100 SXM5 80GB": 989e12,
                   "NVIDIA H100 PCIe": 756e12, "NVIDIA H100 NVL": 835e12, "NVIDIA H200": 989e12,
                   "NVIDIA GH200 480GB": 989e12, "NVIDIA A100-SXM4-80GB": 312e12,
                   "NVIDIA A100-SXM4-40GB": 312e12, "NVIDIA A100 80GB PCIe": 312e12}

TRAIN = dict(vocab=32768, d_model=1024, layers=8, heads=16, d_kv=64, d_ff=4096, batch=16,
             length=1024, group=1024, repeats=5, remats=("none",), chunk=4096, packed=True)
SIZES = {
    "full": NS(matmul=8192, matmul_repeats=10, hbm_mib=2048,
               attention=NS(batch=4, length=2048, heads=16, d_kv=64, d_model=1024, d_ff=256,
                            vocab=512, repeats=5),
               grouped=NS(rows=16384, d_model=1024, d_ff=4096, experts=(8, 64), repeats=5),
               train=NS(**TRAIN), base=NS(batch=32, length=512, shrink=None, repeats=3),
               profile_steps=3,
               peer=["--batch", "16", "--length", "256", "--d-model", "512", "--d-ff", "2048",
                     "--heads", "8", "--layers", "4", "--vocab", "32128", "--repeats", "5",
                     "--warmup", "2"]),
    "smoke": NS(matmul=256, matmul_repeats=2, hbm_mib=8,
                attention=NS(batch=2, length=64, heads=2, d_kv=16, d_model=32, d_ff=32,
                             vocab=64, repeats=1),
                grouped=NS(rows=256, d_model=32, d_ff=64, experts=(4, 8), repeats=1),
                train=NS(**{**TRAIN, **dict(vocab=256, d_model=64, layers=2, heads=2, d_kv=32,
                                            d_ff=128, batch=2, length=64, group=64,
                                            repeats=1, remats=("none",), chunk=0, packed=False)}),
                base=NS(batch=2, length=32, repeats=1,
                        shrink=dict(vocab_size=256, d_model=64, d_ff=128, num_heads=2, d_kv=32,
                                    num_layers=2, num_encoder_layers=2)),
                profile_steps=3,
                peer=["--batch", "2", "--length", "16", "--d-model", "64", "--d-ff", "128",
                      "--heads", "2", "--layers", "2", "--vocab", "256", "--repeats", "1",
                      "--warmup", "1"]),
}


class Unsupported(Exception):
    """An option this tree does not have (yet)."""


def partial(rec, key):
    """A callback that keeps a part's measurements so far in ``rec[key]`` (status "partial"),
    so a time limit or a later failure does not lose them."""
    return lambda out: rec.__setitem__(key, {"status": "partial", **out})


class Record(dict):
    """The case's results, written to ``path`` after every change."""

    def __init__(self, path):
        super().__init__()
        self.path = Path(path)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.path.write_text(json.dumps(self, indent=1, default=str))

    def part(self, key, fn, *args, **kw):
        """rec[key] = fn(...) with a status: ok, unsupported (and why) or error (and what)."""
        start = time.perf_counter()
        try:
            out = {"status": "ok", **fn(*args, **kw)}
        except Unsupported as e:
            out = {"status": "unsupported", "reason": str(e)}
        except Exception as e:                    # noqa: BLE001 -- recorded, the case goes on
            traceback.print_exc()
            kept = {k: v for k, v in self.get(key, {}).items() if k != "status"}
            out = {**kept, "status": "error", "error": f"{type(e).__name__}: {e}"[:3000]}
        self[key] = {**out, "seconds": round(time.perf_counter() - start, 2)}
        gc.collect()
        return out


def replace(obj, **fields):
    """dataclasses.replace; a field or value this tree does not have -> Unsupported."""
    try:
        return dataclasses.replace(obj, **fields)
    except (TypeError, ValueError) as e:
        raise Unsupported(f"{type(obj).__name__} {fields}: {e}") from None


def gpu() -> bool:
    import jax
    return jax.default_backend() == "gpu"


# ------------------------------------------------------------------------------ environment

def environment(rec, z, args):
    import importlib.metadata as md

    import jax
    import jax.numpy as jnp
    rec["machine"] = machine()
    versions = {}
    for dist in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    try:
        from jax._src.lib import cuda_versions
    except ImportError:                        # not a CUDA build
        cuda_versions = None
    for what in ("cuda_runtime", "cuda_driver", "cudnn", "cublas"):
        try:
            versions[what] = getattr(cuda_versions, f"{what}_get_version")()
        except Exception:                      # noqa: BLE001 -- absent here
            pass
    rec["versions"] = versions
    try:                                       # with nvidia-smi's table on a GPU
        rec["environment_info"] = jax.print_environment_info(return_string=True)
    except Exception as e:                     # noqa: BLE001
        rec["environment_info"] = repr(e)
    dev = jax.devices()[0]
    stats = dev.memory_stats() or {}
    rec["device"] = {"kind": dev.device_kind, "platform": dev.platform,
                     "jax_memory_bytes_limit": stats.get("bytes_limit"),
                     "spec_bf16_flops_per_s": SPEC_BF16_FLOPS.get(dev.device_kind)}
    rec["matmul_flops_per_s"] = {
        dt: max(matmul_peak(z.matmul, dt, repeats=z.matmul_repeats) for _ in range(2))
        for dt in ("bfloat16", "float32")}
    rec["matmul_note"] = (f"{z.matmul}^3 jnp.matmul, best of {2 * z.matmul_repeats}; float32 "
                          "at JAX's default precision (TF32 on an NVIDIA GPU)")
    n = z.hbm_mib * 2 ** 20 // 4
    x = jnp.ones((n,), jnp.float32)
    add, total = jax.jit(lambda x: x + 1), jax.jit(jnp.sum)
    copy_s = best_of(lambda: add(x).block_until_ready(), repeats=5, warmup=2)
    sum_s = best_of(lambda: total(x).block_until_ready(), repeats=5, warmup=2)
    rec["hbm_bytes_per_s"] = {"read_write": 2 * 4 * n / copy_s, "read_reduce": 4 * n / sum_s,
                              "array_mib": z.hbm_mib}


# ------------------------------------------------------------------------------ attention

def attention(rec, z, args):
    """Forward + backward of a one-layer decoder LM (relative-position bias, causal mask with
    two packed segments and padding) with each attention implementation, against the
    reference path at float32 and highest matmul precision."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from switchzoo import transformer
    from switchzoo.config import ModelConfig
    a = z.attention
    base = ModelConfig(vocab_size=a.vocab, d_model=a.d_model, num_heads=a.heads, d_kv=a.d_kv,
                       d_ff=a.d_ff, num_layers=1, dtype="bfloat16")
    B, L = a.batch, a.length
    rng = np.random.default_rng(0)
    cut, pad = L // 3, L - L // 8
    seg = np.where(np.arange(L) < cut, 1, 2) * (np.arange(L) < pad)
    batch = {"ids": jnp.asarray(rng.integers(2, a.vocab, (B, L)), jnp.int32),
             "pos": jnp.asarray(np.broadcast_to(np.where(np.arange(L) < cut, np.arange(L),
                                                         np.arange(L) - cut), (B, L))),
             "seg": jnp.asarray(np.broadcast_to(seg, (B, L)), jnp.int32),
             "cot": jnp.asarray(rng.normal(size=(B, L, a.vocab)), jnp.float32)}

    def fwd_bwd(cfg):
        graphdef, params, rest = nnx.split(transformer.build(cfg), nnx.Param, ...)

        def loss(params, b):
            model = nnx.merge(graphdef, params, rest)
            logits, _ = model(b["ids"], positions_BL=b["pos"], segments_BL=b["seg"])
            return jnp.sum(logits * b["cot"]), logits
        f = jax.jit(jax.value_and_grad(loss, has_aux=True))
        compiled = f.lower(params, batch).compile()
        (_, logits), grads = compiled(params, batch)
        flat = {jax.tree_util.keystr(k): np.asarray(v, np.float32)
                for k, v in jax.tree_util.tree_flatten_with_path(grads)[0]}
        return compiled, params, np.asarray(logits, np.float32), flat

    with jax.default_matmul_precision("highest"):
        _, _, truth, truth_g = fwd_bwd(replace(base, attention="reference", dtype="float32"))
    bias_key = next(k for k in truth_g if "relpos" in k)
    rec["config"] = {**vars(a), "dtype": "bfloat16", "segments": [cut, L - cut - (L - pad)],
                     "padding": L - pad, "bias_gradient": bias_key,
                     "truth": "attention='reference', float32, highest matmul precision",
                     "max_abs_truth": {"logits": float(np.abs(truth).max()),
                                       "grads": max(float(np.abs(g).max())
                                                    for g in truth_g.values()),
                                       "bias_grad": float(np.abs(truth_g[bias_key]).max())}}

    def one(impl):
        compiled, params, logits, grads = fwd_bwd(replace(base, attention=impl))
        seconds = best_of(lambda: jax.block_until_ready(compiled(params, batch)),
                          repeats=a.repeats, warmup=1)
        return {"fwd_bwd_s": seconds,
                "max_abs_err": {"logits": float(np.abs(logits - truth).max()),
                                "grads": max(float(np.abs(g - truth_g[k]).max())
                                             for k, g in grads.items()),
                                "bias_grad": float(np.abs(grads[bias_key]
                                                          - truth_g[bias_key]).max())}}
    impls = ("reference", "xla", "cudnn") if gpu() else ("reference", "xla")
    for impl in impls:
        rec.part(impl, one, impl)
    fused = "cudnn" if gpu() else "xla"
    if rec[fused]["status"] == rec["reference"]["status"] == "ok":
        rec["fused"] = fused
        rec["fused_speedup"] = rec["reference"]["fwd_bwd_s"] / rec[fused]["fwd_bwd_s"]


# ------------------------------------------------------------------------------ dropless

def grouped_matmul(rec, z, args):
    """Dropless experts (sorted tokens through a ReLU MLP per expert), forward + backward,
    with each grouped-matmul path: time, and XLA's FLOPs against the real 12 x rows x D x F."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from switchzoo import dropless
    g = z.grouped
    R, D, F = g.rows, g.d_model, g.d_ff
    real = 12.0 * R * D * F
    rec["config"] = {**vars(g), "dtype": "bfloat16", "flops_real": real,
                     "note": "XLA counts a while loop's body once: the blocks path's count is "
                             "one block's, not the loop's"}
    for E in g.experts:
        rng = np.random.default_rng(E)
        x = jnp.asarray(rng.normal(size=(R, D)), jnp.bfloat16)
        expert = jnp.asarray(rng.integers(0, E, R), jnp.int32)
        w = {"wi": jnp.asarray(rng.normal(size=(E, D, F)) / math.sqrt(D), jnp.float32),
             "wo": jnp.asarray(rng.normal(size=(E, F, D)) / math.sqrt(F), jnp.float32)}
        ratio = dropless.ragged_dot_cost(R, D, F, E, "bfloat16")
        rec[f"experts_{E}_auto"] = {"ragged_dot_flops_over_real": ratio,
                                    "auto_picks": dropless.resolve("auto", R, D, F, E,
                                                                   "bfloat16")}

        def one(impl, E=E, x=x, expert=expert, w=w):
            def loss(x, w):
                return jnp.sum(dropless.run_experts(x, expert, w, impl).astype(jnp.float32))
            compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, w).compile()
            cost = compiled.cost_analysis()
            cost = cost[0] if isinstance(cost, (list, tuple)) else cost
            seconds = best_of(lambda: jax.block_until_ready(compiled(x, w)), repeats=g.repeats,
                              warmup=1)
            flops = float((cost or {}).get("flops", 0.0))
            return {"fwd_bwd_s": seconds, "flops_xla": flops,
                    "xla_over_real": flops / real, "real_flops_per_s": real / seconds}
        for impl in ("ragged_dot", "blocks"):
            rec.part(f"experts_{E}_{impl}", one, impl)
