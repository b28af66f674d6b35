"""How noisy is each FFN's gradient from one batch? Experts against dense FFNs.

    python experiments/grad_noise.py --workdir runs/span_long_tuned/dense_lr0.04
        runs/span_long_tuned/switch_8_nojitter_lr0.04 [...] --corpus runs/corpus
        [--batches 32] [--json FILE] [--publish]

Each run's newest checkpoint (evaluate.restore_params) takes K = --batches gradients of its
training objective (steps.make_loss_fn: the cross-entropy and the routing losses, in training
mode: dropout and the training capacity factor, one key per batch), each from one batch of the
run's own batch size of <corpus>/eval.txt as eval.py batches it, at fixed parameters. For every
FFN weight matrix (each expert's slice on its own) over the K gradients g_k:

  noise   s2 = sum_k |g_k - mean|^2 / (K - 1): the variance of one batch's gradient;
  signal  |G|^2 = |mean|^2 - s2 / K: the squared norm of the expected gradient (unbiased);
  nsr     s2 / |G|^2: noise to signal of one batch's gradient. McCandlish et al. (2018)'s
          simple noise scale is batch x nsr examples: the batch at which noise and signal
          are equal. An update computed from one batch points along the expected gradient
          to the degree nsr is small (Adafactor normalises its size, not its direction).

An expert sees about 1/E of the tokens of a dense FFN at its position, so if a token's gradient
is as noisy there, its nsr is ~E times the dense FFN's. The statistic is reported per matrix,
and per Switch layer as the median over its experts, beside the same model's dense FFN layers
and the dense model's layers at the same positions.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import harness  # noqa: E402
import plots  # noqa: E402
from switchzoo import errors, steps, transformer  # noqa: E402
from switchzoo import state as state_lib  # noqa: E402

FFN = ("wi", "wo", "wi_0", "wi_1")


class Bad(Exception):      # a user mistake: one line on stderr, exit status 2
    pass


def ffn_matrices(dims: dict) -> dict[str, bool]:
    """{path: whether it is an expert stack} of every FFN weight matrix."""
    return {name: "experts" in d for name, d in dims.items()
            if name.split("/")[-1] in FFN and "/ffn/" in f"/{name}"}


def noise_of(grads: np.ndarray) -> dict:
    """noise, signal and nsr of K flattened gradients [K, n] (noise_of's module docstring)."""
    k = grads.shape[0]
    mean = grads.mean(0)
    s2 = float(((grads - mean) ** 2).sum() / (k - 1))
    signal = float((mean ** 2).sum() - s2 / k)
    return {"noise": s2, "signal": signal,
            "nsr": s2 / signal if signal > 0 else float("inf")}


def measure(workdir: pathlib.Path, corpus: pathlib.Path, batches: int) -> dict:
    config = harness.held_out_config(workdir, corpus)
    batch = state_lib.global_batch_size(config)
    config.data.max_eval_examples = batch * batches
    ds, setup, params, step = harness.restore_held_out(config, workdir)
    unrolled = setup.cfg.replace(scan_layers=False)     # a scanned run: layer by layer
    if unrolled != setup.cfg:
        params = transformer.layers_as(params, unrolled)
        setup = state_lib.setup(unrolled, setup.layout)
    loss_fn = steps.make_loss_fn(setup, config.label_smoothing)
    matrices = ffn_matrices(setup.dims)

    @jax.jit
    def grads(params, batch, rng):
        g = jax.grad(lambda p: loss_fn(p, batch, rng)[0])(params)
        flat = {state_lib.path_name(p): x for p, x in jax.tree_util.tree_leaves_with_path(g)}
        return {n: flat[n] for n in matrices}

    taken = {n: [] for n in matrices}
    for k, b in enumerate(ds.eval_batches()):
        if k == batches:
            break
        rows = np.asarray(b["targets_segments" if "targets_segments" in b else "segments"])
        if (rows.max(-1) > 0).sum() < batch:      # the last, partly filled batch: left out
            break
        g = jax.device_get(grads(params, jax.tree.map(jnp.asarray, b), steps.step_key(0, k)))
        for n in matrices:
            taken[n].append(np.asarray(g[n], np.float64))
    full = len(next(iter(taken.values())))
    if full < batches:
        raise Bad(f"{corpus / 'eval.txt'} holds {full} full batches of {batch} examples, not "
                  f"--batches={batches}; pass --batches={full} or less, or a larger corpus")
    out = {}
    for n, is_expert in matrices.items():
        g = np.stack(taken[n])                  # [K, ...]
        if is_expert:                           # [K, experts, ...]: each expert alone
            axis = setup.dims[n].index("experts")
            per = [noise_of(np.take(g, e, axis=axis + 1).reshape(len(g), -1))
                   for e in range(g.shape[axis + 1])]
            out[n] = {"experts": per, "nsr_median": float(np.median([p["nsr"] for p in per]))}
        else:
            out[n] = noise_of(g.reshape(len(g), -1))
    return {"workdir": str(workdir), "model": config.model, "step": step, "batch": batch,
            "batches": len(taken[next(iter(taken))]), "matrices": out}


def summary(run: dict) -> dict[str, float]:
    """{path: nsr} with each expert stack's median over its experts."""
    return {n: round(m.get("nsr_median", m.get("nsr")), 3) for n, m in run["matrices"].items()}


def markdown(runs: list[dict]) -> str:
    names = sorted({n for r in runs for n in r["matrices"]})
    head = "| FFN matrix | " + " | ".join(f"{r['model']} (step {r['step']})" for r in runs) + " |"
    lines = [head, "|---" * (len(runs) + 1) + "|"]
    for n in names:
        cells = []
        for r in runs:
            m = r["matrices"].get(n)
            cells.append("" if m is None else f"{m['nsr_median']:.2f} (experts' median)"
                         if "nsr_median" in m else f"{m['nsr']:.2f}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", nargs="+", required=True, type=pathlib.Path)
    p.add_argument("--corpus", required=True, type=pathlib.Path,
                   help="a directory with eval.txt (experiments/english_text.py's)")
    p.add_argument("--batches", type=int, default=32, help="gradients per run (K >= 2)")
    p.add_argument("--json", type=pathlib.Path, help="write the results here")
    p.add_argument("--publish", action="store_true",
                   help="write docs/grad_noise.json and docs/figures/grad_noise.png")
    args = p.parse_args(argv)
    if args.json:
        harness.unpublished(args.json, args.publish)
    try:
        if args.batches < 2:
            raise Bad(f"--batches={args.batches}: the noise needs at least 2 gradients")
        runs = [measure(w, args.corpus, args.batches) for w in args.workdir]
    except (Bad, FileNotFoundError, ValueError, KeyError) as e:
        print(f"error: {errors.one_line(e)}", file=sys.stderr)
        return 2
    result = {"command": harness.command_line("grad_noise.py", args),
              "commit": harness.commit(), "runs": runs,
              "nsr": {r["workdir"]: summary(r) for r in runs}}
    text = json.dumps(result, indent=1)
    for path in ([args.json] if args.json else []) + (
            [ROOT / "docs" / "grad_noise.json"] if args.publish else []):
        path.write_text(text + "\n")
    if args.publish:
        plots.plot_bars({f"{pathlib.Path(r['workdir']).name} (step {r['step']})": {
            n.replace("/layers/", " ").replace("/ffn/", " "): v
            for n, v in summary(r).items()} for r in runs},
            ROOT / "docs" / "figures" / "grad_noise.png",
            "noise / signal of one batch's gradient", log=True,
            title="each FFN matrix's gradient noise (experts: the median over them)")
    print(markdown(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
