"""The vocabulary a profile is attributed in, shared by bench/step_profile.py (the CPU step
beside transformers') and bench/gpu_profile.py (every device op of a trace, CPU or GPU): each
executed XLA op's phase (forward, backward, update), model part (switchzoo's named scopes) and
kind (matmul, copy/layout, elementwise/reduce), read from the compiled module's text."""
from __future__ import annotations

import collections
import os
import re

PARTS = ("attention", "relpos_bias", "masks", "norm", "mlp", "routing", "dispatch", "experts",
         "combine", "embed", "logits", "loss", "optimizer", "checks")
RUNTIME = ("ThreadpoolListener", "ThunkExecutor", "end:", "SlinkyThreadPool")


def hlo_ops(hlo_text: str) -> dict:
    """{instruction name: (opcode, op_name, is_matmul)} of a compiled module's text (kept in
    the file $SWITCHZOO_HLO_OUT names, where set, to read the ops a profile lists)."""
    if os.environ.get("SWITCHZOO_HLO_OUT"):
        with open(os.environ["SWITCHZOO_HLO_OUT"], "w") as f:
            f.write(hlo_text)
    ops = {}
    for m in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$", hlo_text, re.M):
        name, rest = m.groups()
        if rest.startswith("("):          # a tuple shape: skip to its closing parenthesis
            depth = 0
            for i, c in enumerate(rest):
                depth += (c == "(") - (c == ")")
                if depth == 0:
                    break
            rest = rest[i + 1:]
        else:                             # an array shape has no spaces
            rest = rest.split(" ", 1)[-1]
        op = re.match(r"\s*([\w\-]+)\((.*)$", rest)
        if not op:
            continue
        opcode, rest = op.groups()
        meta = re.search(r'op_name="([^"]*)"', rest)
        matmul = opcode in ("dot", "convolution") or any(
            lib in rest for lib in ("__ynn_fusion", "__onednn", "__xnn",          # XLA:CPU
                                    "__cublas", "__cudnn$fmha", "__triton_gemm"))  # a GPU
        ops[name] = (opcode, meta.group(1) if meta else "", matmul)
    return ops


def classify(name: str, op: tuple | None) -> tuple[str, str, str]:
    """(phase, part, kind) of one executed XLA op."""
    opcode, op_name, matmul = op or ("?", "", False)
    phase = ("backward" if "transpose(jvp(" in op_name else
             "forward" if "jvp(" in op_name else "update")
    part = next((p for p in PARTS if re.search(rf"[(/]{p}[)/]", op_name)), "other")
    if matmul:
        kind = "matmul"
    elif opcode in ("copy", "transpose") or name.startswith(("copy", "transpose", "bitcast")):
        kind = "copy/layout"
    else:
        kind = "elementwise/reduce"
    if part in ("optimizer", "checks"):
        phase = "update"
    elif op_name.startswith("state."):      # a weight put in the layout its matmuls read
        phase, part = "forward", "weight layout"
    return phase, part, kind


def summarise(totals, count, wall_ms: float) -> dict:
    ops_ms = sum(totals.values())
    rows = [{"phase": p, "part": part, "kind": k, "ms": round(ms, 2),
             "ops_per_step": round(count[(p, part, k)])}
            for (p, part, k), ms in sorted(totals.items(), key=lambda kv: -kv[1])]
    return {"step_ms": round(wall_ms, 1), "ops_ms": round(ops_ms, 1),
            "outside_ops_ms": round(wall_ms - ops_ms, 1),
            "ops_per_step": round(sum(count.values())), "rows": rows}


def by(side: dict, *fields) -> dict:
    out = collections.Counter()
    for r in side["rows"]:
        out[" ".join(r[f] for f in fields)] += r["ms"]
    return {k: round(v, 2) for k, v in out.most_common()}
