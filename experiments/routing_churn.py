"""How many held-out tokens change expert between two checkpoints of a Switch run?

    python experiments/routing_churn.py --corpus runs/corpus \
        --workdir runs/span_long_tuned/switch_8_nojitter_lr0.04 [--workdir ...] \
        [--steps 11000 12000] [--examples 200] [--json FILE] [--publish]

StableMoE (Dai et al. 2022) finds that tokens still changing expert late in training cost an MoE:
a token's updates so far trained an expert it no longer uses. This measures that churn. Each run's
two checkpoints (--steps, default its two newest kept) read the first --examples held-out
examples of <corpus>/eval.txt as eval.py batches them, eagerly in evaluation mode (no jitter),
each Switch layer's choices recorded as experiments/specialisation.py records them; per Switch
layer (encoder: the input positions, decoder: the target positions, teacher-forced; padding
left out):
  changed   share of tokens whose (first-choice) expert at the second step differs from the first;
  chance    the share a router blind to the first step's choice would change at the same loads,
            1 - sum_e load_1(e) x load_2(e);
  load_1 / load_2   each step's share of tokens per expert.
Writes --json (default: routing_churn.json beside the first --workdir; with --publish
docs/routing_churn.json).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import harness  # noqa: E402
import specialisation as spec  # noqa: E402
from common import machine  # noqa: E402  (bench/common.py; specialisation puts bench/ on the path)
from switchzoo import checkpoints, errors, steps, transformer  # noqa: E402
from switchzoo import state as state_lib  # noqa: E402


def capture(model, cfg, layout, batch) -> list[tuple[str, np.ndarray]]:
    """One evaluation-mode forward pass; per Switch layer in call order (an encoder-decoder's
    encoder's, then its decoder's) its stack and the expert of each valid position, in
    row-major order (the encoder's over input positions, a decoder's over target positions; a
    decoder-only LM's over its positions)."""
    stacks = ({"encoder": batch["inputs_segments"] > 0, "decoder": batch["targets_segments"] > 0}
              if cfg.is_encoder_decoder else {"decoder": batch["segments"] > 0})
    sizes = {v.size: k for k, v in stacks.items()}
    if len(sizes) != len(stacks):
        raise ValueError(f"inputs and targets of one shape {batch['inputs'].shape}: the calls "
                         "cannot be told apart")
    with spec.recording() as calls:
        steps.forward(model, cfg, layout, {k: jnp.asarray(v) for k, v in batch.items()})
    out = []
    for first, _, _ in calls:
        stack = sizes[first.size]
        valid = stacks[stack]
        out.append((stack, first.reshape(valid.shape)[valid]))
    return out


def churn(first: np.ndarray, second: np.ndarray, num_experts: int) -> dict:
    """The share of tokens whose expert differs, beside a blind router's at the same loads."""
    loads = [np.bincount(x, minlength=num_experts) / len(x) for x in (first, second)]
    return {"tokens": int(len(first)), "changed": round(float(np.mean(first != second)), 4),
            "chance": round(float(1 - np.dot(*loads)), 4),
            "load_1": [round(float(v), 4) for v in loads[0]],
            "load_2": [round(float(v), 4) for v in loads[1]]}


def newest_steps(workdir: pathlib.Path) -> list[int]:
    """The run's two newest committed checkpoints, oldest first."""
    ckpt = checkpoints.Checkpoints(workdir / "checkpoints", 1, 1 << 30, read_only=True)
    try:
        kept = sorted(ckpt.all_steps())
    finally:
        ckpt.close()
    if len(kept) < 2:
        raise spec.Bad(f"{workdir} keeps {len(kept)} checkpoint(s); churn needs two (pass "
                       "--steps A B of steps it keeps, or a run with --config.keep_checkpoints "
                       ">= 2)")
    return kept[-2:]


def choices(workdir: pathlib.Path, corpus: pathlib.Path, examples: int, step: int):
    """(model config, [(stack, experts of every valid position)] per Switch layer) of the
    checkpoint at ``step`` over the first ``examples`` held-out examples."""
    config = harness.held_out_config(workdir, corpus, {"data.max_eval_examples": str(examples),
                                                       "restore_step": str(step)})
    ds, setup, params, got = harness.restore_held_out(config, workdir)
    if got != step:
        raise spec.Bad(f"{workdir} restored step {got} for --steps' {step}; pass steps it keeps")
    cfg = setup.cfg
    if cfg.moe is None or cfg.moe.experts_choose(False):
        raise spec.Bad(f"{workdir} ({config.model}) has no tokens-choose Switch layer; pass a "
                       "Switch run's workdir")
    cfg = cfg.replace(scan_layers=False, remat="none")          # layer by layer, no tracing
    model = nnx.merge(state_lib.abstract_model(cfg)[0], transformer.layers_as(params, cfg))
    parts = None
    for batch in ds.eval_batches():
        recs = capture(model, cfg, setup.layout, batch)
        parts = [[] for _ in recs] if parts is None else parts
        for part, (stack, experts) in zip(parts, recs):
            part.append((stack, experts))
    return cfg, [(p[0][0], np.concatenate([e for _, e in p])) for p in parts]


def analyse(workdir: pathlib.Path, corpus: pathlib.Path, examples: int,
            at: list[int] | None) -> dict:
    if not (workdir / "config.json").is_file():
        raise spec.Bad(f"{workdir} is not a train.py workdir (no config.json); pass a span "
                       "Switch run's, e.g. runs/span_long_tuned/switch_8_nojitter_lr0.04")
    at = at or newest_steps(workdir)
    (cfg, first), (_, second) = (choices(workdir, corpus, examples, s) for s in at)
    layers = [{"stack": stack, **churn(a, b, cfg.moe.num_experts)}
              for (stack, a), (_, b) in zip(first, second)]
    return {"workdir": str(workdir), "model": json.loads(
        (workdir / "config.json").read_text())["model"], "steps": at,
        "num_experts": cfg.moe.num_experts, "layers": layers}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", action="append", required=True, type=pathlib.Path)
    p.add_argument("--corpus", type=pathlib.Path, default=ROOT / "runs" / "corpus")
    p.add_argument("--steps", type=int, nargs=2, default=None)
    p.add_argument("--examples", type=int, default=200)
    harness.publish_argument(p)
    p.add_argument("--json", type=pathlib.Path, help="default: routing_churn.json beside the "
                   "first --workdir (docs/routing_churn.json with --publish)")
    args = p.parse_args(argv)
    args.json = harness.unpublished(args.json or (
        harness.DOCS if args.publish else args.workdir[0].parent) / "routing_churn.json",
        args.publish)
    try:
        if args.examples < 1:
            raise spec.Bad(f"--examples {args.examples}: pass a positive count, e.g. 200")
        if args.steps and args.steps[0] >= args.steps[1]:
            raise spec.Bad(f"--steps {args.steps[0]} {args.steps[1]}: pass the earlier step "
                           "first")
        runs = [analyse(w, args.corpus, args.examples, args.steps) for w in args.workdir]
    except (spec.Bad, FileNotFoundError, ValueError, KeyError) as e:
        print(f"error: {errors.one_line(e)}", file=sys.stderr)
        return 2
    command = shlex.join(["python", "experiments/routing_churn.py",
                          *(sys.argv[1:] if argv is None else argv)])
    report = {"command": command, "commit": harness.commit(), "machine": machine(),
              "examples": args.examples, "runs": runs}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    for r in runs:
        print(r["workdir"], r["steps"], [(x["stack"], x["changed"], x["chance"])
                                         for x in r["layers"]])
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        os._exit(code)       # as specialisation.py: no restore threads' noise after the line
