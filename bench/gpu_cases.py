"""The cases of bench/gpu.py, each run in its own process: ``case(rec, z, args)`` fills ``rec``
(a dict saved to disk on every change, so a case cut off by its time limit still leaves what
it measured) at the sizes ``z`` (SIZES["full"] or SIZES["smoke"]); ``args``: gpu.py's flags.

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

from common import Step, best_of, machine, matmul_peak

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


# ------------------------------------------------------------------------------ train steps

# the train-step models besides dense: (experts, dispatch), Switch every other FFN
MODELS = {"dense": None, "switch_einsum": (8, "einsum"), "switch_index": (8, "index"),
          "dropless_8": (8, "dropless"), "dropless_64": (64, "dropless")}


def train_config(z, model: str, remat: str = "none", scan: bool = True):
    from switchzoo.config import ModelConfig, MoeConfig
    t = z.train
    cfg = ModelConfig(vocab_size=t.vocab, d_model=t.d_model, num_heads=t.heads, d_kv=t.d_kv,
                      d_ff=t.d_ff, num_layers=t.layers, dtype="bfloat16", scan_layers=scan)
    cfg = replace(cfg, remat=remat)
    if MODELS[model] is None:
        return cfg
    experts, dispatch = MODELS[model]
    moe = MoeConfig(num_experts=experts, top_k=1, group_size=t.group, jitter=0.0,
                    train_capacity_factor=1.25, sparse_every=2)
    return replace(cfg, moe=replace(moe, dispatch=dispatch))


def unrolled_flops(cfg, batch: int, length: int, **kw) -> float:
    """XLA's FLOPs of the train step of ``cfg`` with its layers unrolled, from the program
    lowered for the CPU (abstract state, no compile; CUDA's lowered programs have no cost
    analysis in jax 0.11): within ~2% of the compiled step's count."""
    import jax
    import jax.numpy as jnp

    from switchzoo import state as state_lib
    from switchzoo import steps
    setup = state_lib.setup(replace(cfg, scan_layers=False), "data_parallel", "data:1",
                            devices=jax.devices("cpu")[:1], optimizer="adamw")
    ids = jax.ShapeDtypeStruct((batch, length), jnp.int32)
    data = {"inputs": ids, "targets": ids,
            "weights": jax.ShapeDtypeStruct((batch, length), jnp.float32)}
    lowered = steps.make_train_step(setup, **kw).lower(jax.eval_shape(setup.init), data)
    cost = lowered.cost_analysis()
    return float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])


def packed_batch(vocab: int, batch: int, length: int) -> dict:
    """A language-model batch as packing gives it: three documents per row (cut at 1/3 and
    3/4 of the row), positions restarting in each: the attention then has a mask, which
    cuDNN's kernel takes as part of its bias."""
    import numpy as np
    rng = np.random.default_rng(0)
    cuts = np.searchsorted([length // 3, 3 * length // 4], np.arange(length), side="right")
    starts = np.array([0, length // 3, 3 * length // 4])[cuts]
    ids = lambda: rng.integers(2, vocab, (batch, length), dtype=np.int32)  # noqa: E731
    return {"inputs": ids(), "targets": ids(), "weights": np.ones((batch, length), np.float32),
            "segments": np.broadcast_to(cuts + 1, (batch, length)).astype(np.int32),
            "positions": np.broadcast_to(np.arange(length) - starts,
                                         (batch, length)).astype(np.int32)}


def measure_step(cfg, batch, length, repeats, loss_chunk=0, extra=None, record=None,
                 xla_flops=True, profile_steps=0, host_batch=None) -> dict:
    """Compile and time the real train step (bench/common.Step) on one device; ``record``
    (if given) gets the timing as soon as it is measured. ``profile_steps`` > 0: then where
    the step's device time goes (bench/gpu_profile.trace), under ``profile``."""
    import inspect

    import jax

    from switchzoo import steps, zoo
    kw = {}
    if loss_chunk:
        if "loss_chunk" not in inspect.signature(steps.make_train_step).parameters:
            raise Unsupported("steps.make_train_step has no loss_chunk argument")
        kw["loss_chunk"] = loss_chunk
    step = Step(cfg, "data:1", "data_parallel", batch, length, jax.devices()[:1],
                host_batch=host_batch, **kw)
    step.run(1)
    seconds = step.time(repeats=repeats, warmup=0)
    hand = 3 * zoo.flops_per_token(cfg, seq_len=length) * step.tokens()
    spec = SPEC_BF16_FLOPS.get(jax.devices()[0].device_kind)
    out = {"compile_s": round(step.compile_s, 2), "step_s": seconds,
           "tokens_per_s": step.tokens() / seconds, "flops_hand": hand,
           "achieved_flops_per_s": hand / seconds,
           "mfu_spec": hand / seconds / spec if spec else None, **(extra or {})}
    if record is not None:        # the timing survives whatever fails below
        record(out)
    if profile_steps:
        try:
            import gpu_profile
            prof = gpu_profile.trace(step, profile_steps)
            out["profile"] = {k: prof[k] for k in (
                "step_ms", "ops_ms", "outside_ops_ms", "ops_per_step", "top_scopes", "by_kind",
                "top_kernels", "attributed_by", "stat_sample")}
        except Exception as e:                # noqa: BLE001 -- the timing stands without it
            out["profile_error"] = f"{type(e).__name__}: {e}"[:500]
        if record is not None:
            record(out)
    try:
        out["memory"] = step.memory()
    except Exception as e:                    # noqa: BLE001
        out["memory_error"] = f"{type(e).__name__}: {e}"[:500]
    try:
        if xla_flops and cfg.scan_layers:  # XLA counts a loop's body once: count it unrolled
            out.update(flops_xla=unrolled_flops(cfg, batch, length, **kw),
                       flops_xla_of="unrolled step, HLO lowered for the CPU")
        elif xla_flops:
            out.update(flops_xla=step.cost_flops(), flops_xla_of="compiled step")
    except Exception as e:                    # noqa: BLE001 -- the count is recorded as missing
        out["flops_xla_error"] = f"{type(e).__name__}: {e}"[:500]
    if "flops_xla" in out:
        out["xla_over_hand"] = out["flops_xla"] / hand
    del step
    return out


def train(model: str):
    def case(rec, z, args):
        from switchzoo import dropless
        t = z.train
        remats = (args.remats.split(",") if args.remats else
                  ("none", "minimal") if model == "dense" and not args.smoke else t.remats)
        rec["config"] = {**vars(t), "remats": tuple(remats), "model": model, "dtype": "bfloat16",
                         "optimizer": "adamw",
                         "scan_layers": not args.no_scan, "loss_chunk": args.loss_chunk,
                         "flops_hand": "3 x zoo.flops_per_token(cfg, seq_len=length) x tokens"}
        variants = [(remat, args.loss_chunk, False) for remat in remats]
        if model == "dense" and not args.loss_chunk and t.chunk:
            variants.append(("none", t.chunk, False))  # the full-vocabulary logits left out
        if model == "dense" and t.packed:
            variants.append(("none", args.loss_chunk, True))  # documents packed: a mask
        for i, (remat, chunk, packed) in enumerate(variants):
            key = f"remat_{remat}" + (f"_chunk{chunk}" if chunk != args.loss_chunk else "") + (
                "_packed" if packed else "")

            def one(remat=remat, chunk=chunk, key=key, traced=i == 0 or packed,
                    packed=packed):
                cfg = train_config(z, model, remat, scan=not args.no_scan)
                extra = {"loss_chunk": chunk}
                if cfg.moe is not None and cfg.moe.dispatch == "dropless":
                    extra["grouped_matmul"] = dropless.resolve(
                        "auto", t.batch * t.length, t.d_model, t.d_ff, cfg.moe.num_experts,
                        "bfloat16")
                if packed:
                    extra["batch"] = "packed: 3 documents per row, positions restarting"
                return measure_step(cfg, t.batch, t.length, t.repeats, chunk, extra,
                                    record=partial(rec, key), xla_flops=not args.no_xla_flops,
                                    profile_steps=args.profile_steps if traced else 0,
                                    host_batch=packed_batch(t.vocab, t.batch, t.length)
                                    if packed else None)
            rec.part(key, one)
    return case


def switch_base_8(rec, z, args):
    """zoo switch_base_8 at bf16 with AdamW and without dropout, as configs/c4.py and
    c4_gpu.py pre-train it (the catalogue's fine-tuning dropout 0.1 keeps attention on the
    reference einsums: the first H100 run measured that, 16% of the matmul rate): whether the
    step fits without remat, else the first remat policy that does."""
    from switchzoo import zoo
    b = z.base
    cfg = replace(zoo.get("switch_base_8"), dtype="bfloat16", scan_layers=not args.no_scan,
                  dropout=0.0)
    if b.shrink:
        cfg = replace(cfg, **b.shrink)
    rec["config"] = {"model": "switch_base_8", "batch": b.batch, "length": b.length,
                     "dtype": "bfloat16", "optimizer": "adamw", "dropout": 0.0,
                     "shrunk": b.shrink,
                     "scan_layers": not args.no_scan}
    for remat in ("none", "minimal", "full"):
        rec.part(f"remat_{remat}", lambda remat=remat: measure_step(
            replace(cfg, remat=remat), b.batch, b.length, b.repeats, args.loss_chunk,
            record=partial(rec, f"remat_{remat}"), xla_flops=not args.no_xla_flops,
            profile_steps=args.profile_steps))
        if remat == "none":
            rec["fits_without_remat"] = "step_s" in rec[f"remat_{remat}"]
        if "step_s" in rec[f"remat_{remat}"]:
            break
