"""Every GPU figure in one run: environment, matmul and HBM rates, attention paths, dropless
grouped matmuls, train steps, Switch-Base-8, a profile and transformers on the same GPU.

    python bench/gpu.py --out out/gpu [--budget 470] [--only train_dense,peer] [--smoke]

Each case (bench/gpu_cases.py; the train steps bench/gpu_train.py; the transformers peer below)
runs in its own process under its own time limit, and all of them under --budget seconds: a
case that fails, runs out of time or finds no time left is recorded as such and the run goes
on. ``DIR/results.json`` is rewritten after every case (a case's partial results survive its
time limit), the profile's full table goes to ``DIR/profile.json``. A measurement of an option
this tree does not have yet is recorded as ``unsupported`` with the error that said so.

Layers are scanned (ModelConfig.scan_layers: compile time flat in depth, so every case fits
the budget; --no-scan unrolls them), and XLA's FLOPs of a scanned step are counted on the
unrolled step's lowered program, since XLA counts a loop's body once.

``--smoke``: every case at toy sizes on whatever JAX finds (CPU here), to check the script.
Memory: JAX takes 75% of the GPU at start; the peer case shares the GPU with torch, so it runs
with XLA_PYTHON_CLIENT_MEM_FRACTION=.5.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gpu_cases
import gpu_train
from common import Step
from gpu_cases import SIZES, Record, gpu

HERE = Path(__file__).resolve().parent
# name -> seconds it may take at full size (in this order, while the budget lasts). Seen on
# one H200 (jax 0.11.2, 2026-11-28, --no-xla-flops): environment 13 s, train_dense 48 s (three
# variants), switch_base_8 67 s, train_switch_index 27 s, attention 89 s, train_dropless_64
# 38 s, peer 104 s (its train part failed early), train_switch_einsum 28 s, train_dropless_8
# 26 s, grouped_matmul 44 s.
LIMITS = {"environment": 45, "train_dense": 110, "train_switch_index": 75, "switch_base_8": 200,
          "attention": 130, "peer": 170, "train_dropless_8": 75, "grouped_matmul": 60,
          "profile": 60, "train_switch_einsum": 75, "train_dropless_64": 90}
SMOKE_LIMIT = 240          # per case with --smoke (a shared 2-core CPU)
MIN_START = 20             # seconds a case needs to be worth starting
# The profile case's kernels each carry their HLO instruction only outside CUDA graphs (in
# one, the H200 run saw "command_buffer_1" on every kernel): it runs without them.
ENV = {"peer": {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".5"},
       "profile": {"XLA_FLAGS": "--xla_gpu_enable_command_buffer="}}


# ------------------------------------------------------------------------------ profile

def profile(rec, z, args):
    """A 3-step jax.profiler trace of the Switch train step (index dispatch, else einsum),
    every device op attributed to its phase and named scope (bench/gpu_profile)."""
    import jax

    import gpu_profile
    t = z.train
    try:
        model = "switch_index"
        cfg = gpu_train.train_config(z, model, scan=not args.no_scan)
    except gpu_cases.Unsupported:
        model = "switch_einsum"
        cfg = gpu_train.train_config(z, model, scan=not args.no_scan)
    step = Step(cfg, "data:1", "data_parallel", t.batch, t.length, jax.devices()[:1])
    step.run(2)
    summary = gpu_profile.trace(step, z.profile_steps)
    rec["config"] = {"model": model, **vars(t), "steps": z.profile_steps}
    for key in ("step_ms", "ops_ms", "top_scopes", "by_kind", "top_kernels", "attributed_by"):
        rec[key] = summary[key]
    if args.out:
        Path(args.out, "profile.json").write_text(json.dumps(summary, indent=1) + "\n")
        rec["rows_in"] = "profile.json"


# ------------------------------------------------------------------------------ peer

def peer(rec, z, args):
    """transformers' PyTorch SwitchTransformers and switchzoo with the same weights
    (bench/peer.Pair) on the same device: fp32 logits parity with room for every token
    (transformers 5.17 ignores expert_capacity), then a bf16 train step each (torch autocast,
    switchzoo bf16 activations), best of interleaved rounds."""
    import jax
    import numpy as np
    import torch
    import transformers

    import peer as peer_lib
    from common import interleaved_best
    flags = list(z.peer)
    B, L = (int(flags[flags.index(f) + 1]) for f in ("--batch", "--length"))
    pargs = peer_lib.build_parser().parse_args(flags + ["--expert-capacity", str(B * L)])
    device = "cuda" if gpu() and torch.cuda.is_available() else "cpu"
    pair = peer_lib.Pair(pargs)
    theirs = pair.theirs.to(device)
    src, mask, dec_in, tgt = (torch.tensor(a, device=device)
                              for a in (pair.src, pair.mask, pair.dec_in, pair.tgt))
    rec["config"] = {"flags": flags, "expert_capacity": B * L, "device": device,
                     "torch": torch.__version__, "transformers": transformers.__version__,
                     "switchzoo_dispatch": pair.cfg.moe.dispatch}

    def parity():
        tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        theirs.eval()
        with torch.no_grad():
            ref = theirs(input_ids=src, attention_mask=mask,
                         decoder_input_ids=dec_in).logits.float().cpu().numpy()
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
        with jax.default_matmul_precision("highest"):
            got = np.asarray(pair.ours(pair.src, attention_mask=pair.mask,
                                       decoder_input_ids=pair.dec_in))
        diff = float(np.abs(got - ref).max())
        return {"max_abs_dlogits": diff, "max_abs_logits": float(np.abs(ref).max()),
                "ok": diff < peer_lib.LOGITS_TOLERANCE}
    rec.part("logits_fp32", parity)

    def train():
        pair.cfg = pair.cfg.replace(dtype="bfloat16")
        ours_step = pair.ours_train_step()
        theirs.train()
        opt = torch.optim.AdamW(theirs.parameters(), lr=1e-3, betas=(0.9, 0.98),
                                weight_decay=0.0, fused=True)

        router = {"output_router_logits": True}
        try:                     # transformers 5.17 fails to collect the router logits it
            with torch.autocast(device, dtype=torch.bfloat16):   # asked for; 5.24 does not
                theirs(input_ids=src, attention_mask=mask, labels=tgt, **router)
        except ValueError as e:
            router = {"output_router_logits": False,
                      "why": f"{type(e).__name__}: {e} (so its loss is the cross-entropy alone; "
                             "the router losses are a few small reductions)"}
        theirs.zero_grad(set_to_none=True)

        def theirs_step():
            with torch.autocast(device, dtype=torch.bfloat16):
                out = theirs(input_ids=src, attention_mask=mask, labels=tgt,
                             output_router_logits=router["output_router_logits"])
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if device == "cuda":
                torch.cuda.synchronize()
        ours_s, theirs_s = interleaved_best((ours_step, theirs_step), pargs.repeats,
                                            pargs.warmup)
        return {"switchzoo_step_s": ours_s, "transformers_step_s": theirs_s,
                "switchzoo_tokens_per_s": B * L / ours_s,
                "transformers_tokens_per_s": B * L / theirs_s,
                "switchzoo_over_transformers_tokens_per_s": theirs_s / ours_s,
                "transformers_side": "torch.autocast bfloat16, AdamW(fused=True)",
                "transformers_router_losses": router}
    rec.part("train_bf16", train)


CASES = {"environment": gpu_cases.environment, "attention": gpu_cases.attention,
         "grouped_matmul": gpu_cases.grouped_matmul,
         **{f"train_{m}": gpu_train.train(m) for m in gpu_train.MODELS},
         "switch_base_8": gpu_train.switch_base_8, "profile": profile, "peer": peer}
assert set(CASES) == set(LIMITS)


def case_env(name: str, smoke: bool) -> dict:
    env = {**os.environ, **ENV.get(name, {})}
    if "XLA_FLAGS" in ENV.get(name, {}):         # added to the caller's flags, not instead
        env["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {env['XLA_FLAGS']}".strip()
    if smoke:      # LLVM at -O0: the smoke checks the script, and compiles dominate it on CPU
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
                            ).strip()
    return env


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--out", default="out/gpu", help="folder for results.json and profile.json")
    a("--budget", type=float, default=470, help="seconds for all cases together")
    a("--only", default="", help="comma-separated subset of " + ",".join(LIMITS))
    a("--smoke", action="store_true", help="toy sizes, any backend: checks the script")
    a("--loss-chunk", type=int, default=0, help="train steps' loss_chunk (0: the default)")
    a("--no-scan", action="store_true", help="unrolled layers (default: scan_layers)")
    a("--no-xla-flops", action="store_true",
      help="skip XLA's FLOP count of scanned train steps (it is lowered for the CPU, so "
           "bench/flops.py gives the same count on any machine)")
    a("--remats", default="", help="comma-separated remat policies of the train_* cases "
      "(default: train_dense none and minimal, the others none, their baseline; "
      "--smoke: none)")
    a("--profile-steps", type=int, default=None, help="steps traced after each train "
      "step's timing, for where its device time goes (default 3; --smoke 0: the profile "
      "case traces)")
    a("--case", help=argparse.SUPPRESS)          # the child: run this one case
    return p


def run_case(args) -> None:
    """The child: one case, its record kept in DIR/.case-NAME.json."""
    z = SIZES["smoke" if args.smoke else "full"]
    rec = Record(Path(args.out, f".case-{args.case}.json"))
    try:
        CASES[args.case](rec, z, args)
    except gpu_cases.Unsupported as e:          # the case needs an option this tree lacks
        rec["case"] = {"status": "unsupported", "reason": str(e)}


def status_of(record: dict) -> tuple[str, str | None]:
    failed = [k for k, v in record.items() if isinstance(v, dict) and v.get("status") == "error"]
    return ("error", f"failed: {', '.join(failed)}") if failed else ("ok", None)


def summarise(cases: dict) -> dict:
    """MFU against the measured bf16 matmul rate, and each MoE step over the dense one."""
    env = cases.get("environment", {})
    rate = env.get("matmul_flops_per_s", {}).get("bfloat16")
    out = {"matmul_bf16_flops_per_s": rate}
    for name, case in cases.items():
        for part in case.values():
            if isinstance(part, dict) and part.get("achieved_flops_per_s") and rate:
                part["mfu_measured"] = part["achieved_flops_per_s"] / rate
    dense = cases.get("train_dense", {})
    for name, case in cases.items():
        if not name.startswith("train_") or name == "train_dense":
            continue
        for remat, part in case.items():
            base = dense.get(remat)
            if isinstance(part, dict) and part.get("step_s") and isinstance(base, dict) \
                    and base.get("step_s"):
                out[f"{name[6:]}_over_dense_{remat}"] = part["step_s"] / base["step_s"]
    return out


def unsupported(cases: dict) -> list[str]:
    return [f"{name}.{k}: {v['reason']}" for name, case in cases.items() for k, v in case.items()
            if isinstance(v, dict) and v.get("status") == "unsupported"]


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.case:
        run_case(args)
        return {}
    from switchzoo.config import REMAT
    bad = sorted(set(filter(None, args.remats.split(","))) - set(REMAT))
    if bad:
        sys.exit(f"error: unknown remat polic(ies) {bad} in --remats; choose from "
                 f"{', '.join(REMAT)}")
    names = [n for n in args.only.split(",") if n] or list(LIMITS)
    unknown = sorted(set(names) - set(LIMITS))
    if unknown:
        sys.exit(f"error: unknown case(s) {unknown}; choose from {', '.join(LIMITS)}")
    result = {"bench": "gpu", "smoke": args.smoke, "budget_s": args.budget,
              "argv": sys.argv[1:], "cases": {}}
    path = out / "results.json"
    start = time.monotonic()

    def save():
        result["seconds"] = round(time.monotonic() - start, 1)
        result["summary"] = summarise(result["cases"])
        result["unsupported"] = unsupported(result["cases"])
        path.write_text(json.dumps(result, indent=1, default=str) + "\n")

    flags = (["--smoke"] if args.smoke else []) + (["--no-scan"] if args.no_scan else []) + (
        ["--no-xla-flops"] if args.no_xla_flops else []) + [
        "--loss-chunk", str(args.loss_chunk)] + (["--remats", args.remats] if args.remats else [])
    profile_steps = (0 if args.smoke else 3) if args.profile_steps is None else args.profile_steps
    flags += ["--profile-steps", str(profile_steps)]
    for name in names:
        left = args.budget - (time.monotonic() - start)
        limit = min(SMOKE_LIMIT if args.smoke else LIMITS[name], left)
        if limit < MIN_START:
            result["cases"][name] = {"status": "skipped", "reason": f"{left:.0f} s of the "
                                     f"{args.budget:.0f} s budget left"}
            save()
            continue
        partial = out / f".case-{name}.json"
        partial.unlink(missing_ok=True)
        cmd = [sys.executable, str(HERE / "gpu.py"), "--case", name, "--out", str(out), *flags]
        print(f"== {name} (limit {limit:.0f} s)", file=sys.stderr, flush=True)
        began = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit,
                                  env=case_env(name, args.smoke))
            status, reason = ("error", f"exit {proc.returncode}: {proc.stderr[-3000:]}") \
                if proc.returncode else (None, None)
        except subprocess.TimeoutExpired:
            status, reason = "timeout", f"over its {limit:.0f} s limit"
        record = json.loads(partial.read_text()) if partial.exists() else {}
        partial.unlink(missing_ok=True)
        if status is None:
            status, reason = status_of(record)
        result["cases"][name] = {"status": status, **({"reason": reason} if reason else {}),
                                 "seconds": round(time.monotonic() - began, 1),
                                 "limit_s": round(limit), **record}
        print(f"== {name}: {status} in {result['cases'][name]['seconds']} s", file=sys.stderr,
              flush=True)
        save()
    save()
    return result


if __name__ == "__main__":
    main()
