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

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import harness  # noqa: E402
import specialisation as spec  # noqa: E402
import workdir_report  # noqa: E402
from switchzoo import checkpoints, evaluate, steps, transformer  # noqa: E402
from switchzoo import state as state_lib  # noqa: E402

Bad = workdir_report.Bad


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
        raise Bad(f"{workdir} keeps {len(kept)} checkpoint(s); churn needs two (pass "
                       "--steps A B of steps it keeps, or a run with --config.keep_checkpoints "
                       ">= 2)")
    return kept[-2:]


def routed(model, cfg, layout, batches) -> list[tuple[str, np.ndarray]]:
    """[(stack, experts of every valid position over ``batches``)] per Switch layer."""
    parts = None
    for batch in batches:
        recs = capture(model, cfg, layout, batch)
        parts = [[] for _ in recs] if parts is None else parts
        for part, rec in zip(parts, recs):
            part.append(rec)
    return [(p[0][0], np.concatenate([e for _, e in p])) for p in parts]


def choices(workdir: pathlib.Path, corpus: pathlib.Path, examples: int, at: list[int]):
    """(model config, per step of ``at``: routed()) of the run's checkpoints over its first
    ``examples`` held-out examples, batched and tokenized once."""
    config = harness.held_out_config(workdir, corpus, {"data.max_eval_examples": str(examples),
                                                       "restore_step": str(at[0])})
    ds, setup, params, _ = harness.restore_held_out(config, workdir)
    if setup.cfg.moe is None or setup.cfg.moe.experts_choose(False):
        raise Bad(f"{workdir} ({config.model}) has no tokens-choose Switch layer; pass a "
                  "Switch run's workdir")
    cfg = setup.cfg.replace(scan_layers=False, remat="none")    # layer by layer, no tracing
    graphdef = state_lib.abstract_model(cfg)[0]
    batches = list(ds.eval_batches())
    out = []
    for step in at:
        if step != at[0]:
            config.restore_step = step
            _, params, _ = evaluate.restore_params(config, workdir, setup.layout,
                                                   ds.tokenizer.vocab_size,
                                                   ds.tokenizer.num_pieces)
        model = nnx.merge(graphdef, transformer.layers_as(params, cfg))
        out.append(routed(model, cfg, setup.layout, batches))
    return cfg, out


def analyse(workdir: pathlib.Path, args) -> dict:
    if not (workdir / "config.json").is_file():
        raise Bad(f"{workdir} is not a train.py workdir (no config.json); pass a span "
                  "Switch run's, e.g. runs/span_long_tuned/switch_8_nojitter_lr0.04")
    at = args.steps or newest_steps(workdir)
    cfg, (first, second) = choices(workdir, args.corpus, args.examples, at)
    layers = [{"stack": stack, **churn(a, b, cfg.moe.num_experts)}
              for (stack, a), (_, b) in zip(first, second)]
    return {"workdir": str(workdir), "model": json.loads(
        (workdir / "config.json").read_text())["model"], "steps": at,
        "num_experts": cfg.moe.num_experts, "layers": layers}


def check(args) -> None:
    if args.steps and args.steps[0] >= args.steps[1]:
        raise Bad(f"--steps {args.steps[0]} {args.steps[1]}: pass the earlier step first")


def summary(runs: list[dict]) -> str:
    return "\n".join(f"{r['workdir']} {r['steps']} " + str(
        [(x["stack"], x["changed"], x["chance"]) for x in r["layers"]]) for r in runs)


def main(argv=None) -> int:
    p = workdir_report.parser(__doc__, "routing_churn")
    p.add_argument("--steps", type=int, nargs=2, default=None)
    return workdir_report.run(p, argv, "routing_churn", analyse, summary,
                              fields=lambda args: {"examples": args.examples}, check=check)


if __name__ == "__main__":
    workdir_report.exit_with(main())
