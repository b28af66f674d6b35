"""The train-step cases of bench/gpu.py (``train_<model>`` and ``switch_base_8``) and what they
share: the models, XLA's FLOP count of an unrolled step, a packed batch, and ``measure_step``
(compile, time, profile, memory and FLOPs of the real train step on one device). The other
cases, and the record every case fills: bench/gpu_cases.py."""
from __future__ import annotations

import inspect

from common import Step
from gpu_cases import SPEC_BF16_FLOPS, Unsupported, partial, replace


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


def optimizer(moments: str = "float32"):
    """AdamW as the train cases run it; ``moments`` "bfloat16": its moments at half width
    (--config.moments_dtype), where this tree has that option."""
    from switchzoo import optim
    if moments == "float32":
        return "adamw"
    if "moments_dtype" not in inspect.signature(optim.make_optimizer).parameters:
        raise Unsupported("optim.make_optimizer has no moments_dtype argument")
    return optim.make_optimizer("adamw", 1e-3, 100, moments_dtype=moments)


def measure_step(cfg, batch, length, repeats, loss_chunk=0, extra=None, record=None,
                 xla_flops=True, profile_steps=0, host_batch=None, moments="float32") -> dict:
    """Compile and time the real train step (bench/common.Step) on one device; ``record``
    (if given) gets the timing as soon as it is measured. ``profile_steps`` > 0: then where
    the step's device time goes (bench/gpu_profile.trace), under ``profile``."""
    import jax

    from switchzoo import steps, zoo
    kw = {}
    if loss_chunk:
        if "loss_chunk" not in inspect.signature(steps.make_train_step).parameters:
            raise Unsupported("steps.make_train_step has no loss_chunk argument")
        kw["loss_chunk"] = loss_chunk
    step = Step(cfg, "data:1", "data_parallel", batch, length, jax.devices()[:1],
                host_batch=host_batch, optimizer=optimizer(moments), **kw)
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
    reference einsums: the first H100 run measured that, 16% of the matmul rate): without
    remat and under "minimal" (c4_gpu.py's: one cuDNN forward per layer, its outputs kept),
    "full" only where neither fits; then without remat with AdamW's moments in bfloat16
    (--smoke: without remat alone)."""
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
            profile_steps=args.profile_steps if remat != "full" else 0))
        if remat == "none":
            rec["fits_without_remat"] = "step_s" in rec[f"remat_{remat}"]
        if "step_s" in rec[f"remat_{remat}"] and (remat == "minimal" or args.smoke):
            break     # --smoke: "minimal" is the same code on another config (train_dense's)
    if "step_s" in rec["remat_none"] and not args.smoke:   # --smoke: the same code again
        rec.part("remat_none_adamw_bf16_moments", lambda: measure_step(
            cfg, b.batch, b.length, b.repeats, args.loss_chunk, xla_flops=not args.no_xla_flops,
            record=partial(rec, "remat_none_adamw_bf16_moments"), moments="bfloat16"))
