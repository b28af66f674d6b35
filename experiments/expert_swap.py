"""How much does a trained Switch model lose when each token gets another expert than its router's?

    python experiments/expert_swap.py --corpus runs/corpus \
        --workdir runs/span_long_tuned/switch_8_nojitter_lr0.04 [--workdir ...] \
        [--examples 200] [--json FILE] [--publish]

Experts that specialised are not interchangeable: give a token another expert and the loss
rises. Experts that are near-copies of one FFN (each trained on a share of the tokens) can be
swapped at little cost. Each run's newest checkpoint scores the first --examples held-out
examples of <corpus>/eval.txt as eval.py batches them (loss per target token; the routing, its
capacity and gates untouched) with its own experts, then with every Switch layer's experts
rotated by k (a token routed to expert e computes with expert (e - k) mod E's weights) for each
k = 1 .. E-1, in every stack at once and (an encoder-decoder) in each stack alone:
  own          the held-out loss as trained;
  rotated      per k, the loss with the experts so rotated; mean_rise: their mean minus own.
Writes --json (default: expert_swap.json beside the first --workdir; with --publish
docs/expert_swap.json).
"""
from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import harness  # noqa: E402
import workdir_report  # noqa: E402
from switchzoo import steps  # noqa: E402
from switchzoo import state as state_lib  # noqa: E402


Bad = workdir_report.Bad


def rotated(params, dims: dict, k: int, stack: str | None = None):
    """``params`` with every expert weight (an 'experts' dim, not a router's) rolled by ``k``
    along it: expert e holds what expert (e - k) mod E held. ``stack`` ("encoder" or
    "decoder"): that stack's alone."""
    def one(path, x):
        name = state_lib.path_name(path)
        d = dims[name]
        if "experts" not in d or "/router/" in f"/{name}" or (
                stack is not None and not name.startswith(stack + "/")):
            return x
        return jnp.roll(x, k, axis=d.index("experts"))
    return jax.tree_util.tree_map_with_path(one, params)


def held_out_loss(eval_step, params, batches) -> float:
    """Loss per target token over ``batches``."""
    nll = tokens = 0.0
    for batch in batches:
        out = eval_step(params, batch)
        nll, tokens = nll + float(out["nll"]), tokens + float(out["tokens"])
    return nll / tokens


def analyse(workdir: pathlib.Path, corpus: pathlib.Path, examples: int) -> dict:
    if not (workdir / "config.json").is_file():
        raise Bad(f"{workdir} is not a train.py workdir (no config.json); pass a Switch run's, "
                  "e.g. runs/span_long_tuned/switch_8_nojitter_lr0.04")
    config = harness.held_out_config(workdir, corpus, {"data.max_eval_examples": str(examples)})
    ds, setup, params, step = harness.restore_held_out(config, workdir)
    cfg = setup.cfg
    if cfg.moe is None or cfg.moe.num_experts < 2:
        raise Bad(f"{workdir} ({config.model}) has no Switch layer of two or more experts; "
                  "pass a Switch run's workdir")
    eval_step = steps.make_eval_step(setup)
    batches = list(ds.eval_batches())
    E = cfg.moe.num_experts
    stacks = {"all": None}
    if cfg.is_encoder_decoder:
        stacks.update(encoder="encoder", decoder="decoder")
    own = held_out_loss(eval_step, params, batches)
    out = {"workdir": str(workdir), "model": config.model, "step": step, "num_experts": E,
           "own": round(own, 4), "rotated": {}}
    for label, stack in stacks.items():
        losses = [held_out_loss(eval_step, rotated(params, setup.dims, k, stack), batches)
                  for k in range(1, E)]
        out["rotated"][label] = {"by_k": [round(v, 4) for v in losses],
                                 "mean_rise": round(sum(losses) / len(losses) - own, 4)}
    return out


def summary(runs: list[dict]) -> str:
    return "\n".join(f"{r['workdir']} {r['own']} " + str(
        {k: v["mean_rise"] for k, v in r["rotated"].items()}) for r in runs)


def main(argv=None) -> int:
    return workdir_report.run(
        workdir_report.parser(__doc__, "expert_swap"), argv, "expert_swap",
        lambda w, args: analyse(w, args.corpus, args.examples), summary,
        fields=lambda args: {"examples": args.examples})


if __name__ == "__main__":
    workdir_report.exit_with(main())
