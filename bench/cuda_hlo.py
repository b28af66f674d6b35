"""The GPU levers, proven on this CPU in the program lowered for CUDA: the real train step
(switchzoo.steps) traced from abstract state and lowered with ``lowering_platforms=("cuda",)``,
with JAX's cuDNN version probe answered (no GPU here), so that attention lowers to cuDNN's
fused kernel exactly as it would on a GPU, and the relative-position table takes the GPU's
gradient (relpos.DIAGONAL_GRADIENT). What the StableHLO text then says, per case:

  * every cuDNN fused-attention call, forward and backward, with its bias operand's shape and
    mask type: no bias [B, H, T, S] (nor its gradient, nor a batch reduction of one) unless
    packed segments join the bias (attention_impl.PACKED);
  * forward calls against backward calls: equal when no remat policy recomputes the forward
    ("minimal" saves cuDNN's outputs: layers.minimal_policy);
  * every float scatter-add (indices XLA cannot know are unique: atomics on a GPU) with its
    result shape and update count: none in the Switch dispatch (switchzoo.permute), none over
    H x T x S for the relative-position table;
  * XLA's FLOPs of the unrolled step (lowered for the CPU: CUDA's lowered programs have no cost
    analysis) over the hand count, for Switch-Base-8.

    python bench/cuda_hlo.py [--smoke] [--out F]

No compile for the GPU happens here (there is none to compile for): the bytes a step moves
and its kernels' times wait for a device (bench/gpu.py, docs/benchmarks.md).
"""
from __future__ import annotations

import contextlib
import dataclasses
import re

from common import emit, machine, parser

CUDNN = re.compile(r"custom_call @__cudnn\$fmha(\w+)\((.*?)\) \{(.*?)\} : \((.*?)\) -> (.*)")
SCATTER = re.compile(r'"stablehlo\.scatter"\([^)]*\) <\{([^\n]*)\}> \(\{\n\s*\^bb0[^\n]*\n'
                     r'\s*%\S+ = stablehlo\.(\w+) [^\n]*\n(?:[^\n]*\n)*?\s*\}\) : \(([^\n]*)\) '
                     r'-> ([^\n]*)')
TENSOR = re.compile(r"tensor<([0-9x]*)x?(\w+)>")


@contextlib.contextmanager
def as_on_a_gpu():
    """Trace as a GPU run would: cuDNN's version probe answered (9.10), attention's cuDNN
    checks passed (attention_impl: cuDNN asked for by name serves), the relative-position
    table's diagonal gradient (relpos), the experts on capacity slots (moe.KEPT_ONLY: the CPU's
    kept-only loop is not a GPU's), dropless without the CPU's per-expert branches
    (dropless.EACH_EXPERT). Restored on exit."""
    from jax._src.cudnn import fused_attention_stablehlo as fa

    from switchzoo import attention_impl, dropless, moe, relpos
    saved = (fa.check_cudnn_version, attention_impl._cudnn_refusal, relpos.DIAGONAL_GRADIENT,
             moe.KEPT_ONLY, dropless.EACH_EXPERT)
    fa.check_cudnn_version = lambda: 91000
    attention_impl._cudnn_refusal = lambda cfg, backend: ""
    relpos.DIAGONAL_GRADIENT, moe.KEPT_ONLY, dropless.EACH_EXPERT = True, False, False
    try:
        yield
    finally:
        (fa.check_cudnn_version, attention_impl._cudnn_refusal, relpos.DIAGONAL_GRADIENT,
         moe.KEPT_ONLY, dropless.EACH_EXPERT) = saved


def batch_fields(batch: int, length: int, packed: bool = False, lengths: bool = False,
                 encoder_decoder: bool = False) -> dict:
    """Abstract batch fields as the input pipeline makes them: no segments (every row one full
    sequence), ``packed`` (segments and positions, several documents a row) or ``lengths``
    (evaluation's rows: one sequence each, right-padded)."""
    import jax
    import jax.numpy as jnp
    ids = jax.ShapeDtypeStruct((batch, length), jnp.int32)
    row = jax.ShapeDtypeStruct((batch,), jnp.int32)
    out = {"inputs": ids, "targets": ids,
           "weights": jax.ShapeDtypeStruct((batch, length), jnp.float32)}
    sides = ("inputs_", "targets_") if encoder_decoder else ("",)
    for side in sides:
        if packed:
            out.update({f"{side}segments": ids, f"{side}positions": ids})
        if lengths:
            out.update({f"{side}segments": ids, f"{side}lengths": row})
    return out


def lower(cfg, batch: int, length: int, **fields) -> str:
    """The train step of ``cfg`` (AdamW, one device) lowered for CUDA: StableHLO text."""
    import jax

    from switchzoo import state as state_lib
    from switchzoo import steps
    with as_on_a_gpu():
        setup = state_lib.setup(cfg, "data_parallel", "data:1", devices=jax.devices()[:1],
                                optimizer="adamw")
        data = batch_fields(batch, length, encoder_decoder=cfg.is_encoder_decoder, **fields)
        traced = steps.make_train_step(setup).trace(jax.eval_shape(setup.init), data)
        return traced.lower(lowering_platforms=("cuda",)).as_text()


def _shapes(types: str) -> list[tuple[tuple[int, ...], str]]:
    return [(tuple(int(d) for d in dims.split("x") if d), dtype)
            for dims, dtype in TENSOR.findall(types)]


def facts(text: str, B: int, H: int, T: int, S: int | None = None) -> dict:
    """What the lowered step ``text`` (batch B, heads H, query/key lengths T and S) does with
    attention and scatters (module doc)."""
    S = S or T
    calls = []
    for kind, _, attrs, operands, _ in CUDNN.findall(text):
        mask = re.search(r"mask_type\\22: \\22(\w+)", attrs)
        shapes = _shapes(operands)
        calls.append({"kind": "backward" if kind.endswith("Backward") else "forward",
                      "call": kind, "mask_type": mask.group(1) if mask else None,
                      "bias": [list(s) for s, _ in shapes if len(s) == 4 and s[1] == H
                               and s[2:] in ((T, T), (T, S))]})
    scatters = []
    for m in SCATTER.finditer(text):
        attrs, op, types, result = m.groups()
        shapes = _shapes(types)
        out = _shapes(result)[0]
        if op != "add" or "unique_indices = true" in attrs or out[1].startswith(("i", "ui")):
            continue
        updates = shapes[-1][0]
        scatters.append({"result": list(out[0]), "dtype": out[1],
                         "updates": int(_prod(updates))})
    full = {f"{B}x{H}x{T}x{n}x" for n in {T, S}}
    reductions = [line for line in text.splitlines() if "stablehlo.reduce" in line
                  and any(f"tensor<{f}" in line for f in full)]
    return {"cudnn_forward": sum(c["kind"] == "forward" for c in calls),
            "cudnn_backward": sum(c["kind"] == "backward" for c in calls),
            "mask_types": sorted({c["mask_type"] for c in calls if c["mask_type"]}),
            "bias_shapes": sorted({tuple(b) for c in calls for b in c["bias"]}),
            "tensors_BHTS": sum(text.count(f"tensor<{f}") for f in full),
            "batch_reductions_BHTS": len(reductions),
            "scatter_adds": scatters,
            "largest_scatter_updates": max((s["updates"] for s in scatters), default=0)}


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def cases(smoke: bool):
    """(name, cfg, batch, length, fields) of every case: the dense LM of bench/gpu.py's train
    case, its Switch twins (index and dropless dispatch), and Switch-Base-8 at 32 x 512 (bf16,
    no dropout)."""
    import gpu_cases
    from gpu_train import train_config

    from switchzoo import zoo
    z = gpu_cases.SIZES["smoke" if smoke else "full"]
    t, b = z.train, z.base
    base = dataclasses.replace(zoo.get("switch_base_8"), dtype="bfloat16", dropout=0.0,
                               scan_layers=True, attention="cudnn")
    if b.shrink:
        base = dataclasses.replace(base, **b.shrink)
    out = []
    for remat in ("none", "minimal"):
        dense = dataclasses.replace(train_config(z, "dense", remat), attention="cudnn")
        out += [(f"dense_{remat}", dense, t.batch, t.length, {}),
                (f"dense_{remat}_packed", dense, t.batch, t.length, {"packed": True})]
        out.append((f"switch_base_8_{remat}", dataclasses.replace(base, remat=remat), b.batch,
                    b.length, {}))
    dense = dataclasses.replace(train_config(z, "dense"), attention="cudnn")
    out.append(("dense_none_eval_rows", dense, t.batch, t.length, {"lengths": True}))
    for model in ("switch_index", "dropless_8"):
        cfg = dataclasses.replace(train_config(z, model), attention="cudnn")
        out.append((f"{model}_none", cfg, t.batch, t.length, {}))
    return out, base, b


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--smoke", action="store_true", help="toy sizes (what the tests run)")
    args = p.parse_args(argv)
    from gpu_train import unrolled_flops

    from switchzoo import zoo
    all_cases, base, b = cases(args.smoke)
    result = {"benchmark": "cuda_hlo", "machine": machine(), "smoke": args.smoke, "cases": {}}
    for name, cfg, batch, length, fields in all_cases:
        text = lower(cfg, batch, length, **fields)
        result["cases"][name] = {
            "config": {"batch": batch, "length": length, "remat": cfg.remat,
                       "layers": cfg.num_layers + cfg.num_encoder_layers,
                       "experts": cfg.moe.num_experts if cfg.moe else 0, **fields},
            **facts(text, batch, cfg.num_heads, length)}
    # the reference attention's einsums: a cuDNN call is a custom call XLA counts no FLOPs of
    base = dataclasses.replace(base, attention="reference")
    hand = 3 * zoo.flops_per_token(base, seq_len=b.length) * b.batch * b.length
    xla = unrolled_flops(base, b.batch, b.length)
    result["switch_base_8_flops"] = {"xla": xla, "hand": hand, "xla_over_hand": xla / hand}
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
