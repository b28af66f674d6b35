"""Have the experts of a trained decoder-only Switch LM specialised, and by what?

    python experiments/specialisation.py --workdir runs/lm/switch_8 [--workdir runs/lm/top2_8]
        --corpus runs/corpus [--sequences 200] [--json FILE] [--publish]

Each run's newest checkpoint (evaluate.restore_params) reads the first --sequences texts of
<corpus>/eval.txt as eval.py batches them (data.build(evaluating=True).eval_batches), in
evaluation mode (no jitter, the eval capacity factor), eagerly, with moe.route (and moe.choose,
the dropless path) wrapped to record each Switch layer's choices; [groups, group_size] maps back
to [batch, length] by the row-major reshape moe.py makes. Padding is not routed and left out.
With top-k > 1 every statistic reads a token's first choice (its most probable expert).

Per Switch layer, over the valid tokens (token T: the input id there; context: the id before
it, -1 at a sequence's start):
  load         fraction of tokens whose first choice is each expert (before capacity);
  dropped      fraction of tokens whose first choice got no slot (dropped_picks: of all picks);
  determinism  for each id seen >= 5 times, the share of its occurrences that go to its most
               frequent expert, averaged weighted by occurrences (1: the id fixes the expert);
  nmi_token    I(E;T) / H(E), plug-in from counts: the share of the expert's entropy that the
               token id explains (1: all of it, 0: none);
  nmi_context  I(E;T_prev) / H(E), the same for the previous id.
Each of these three has a ``baseline``: the statistic with the expert labels shuffled across
tokens (same loads and id counts; mean of 5 shuffles), i.e. a router blind to the id. Plug-in MI
over many rare ids is biased upward: read a value against its baseline, not against 0.
  pieces       per expert, the 8 ids (seen >= 5 times) most over-represented in it, as
               SentencePiece pieces (U+2581: a word start): ratio = count in the expert / count
               expected at its overall load; 1 / load means every occurrence of the id.
"""
from __future__ import annotations

import contextlib
import inspect
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import sentencepiece as spm  # noqa: E402
from flax import nnx  # noqa: E402

import harness  # noqa: E402
import workdir_report  # noqa: E402
from switchzoo import evaluate, moe, routing, steps, transformer  # noqa: E402
from switchzoo import state as state_lib  # noqa: E402

MIN_COUNT = 5          # an id counts for determinism and pieces when seen this often
SHUFFLES = 5
PIECES = 8


Bad = workdir_report.Bad


def switch_layers(cfg) -> list[int]:
    return [i for i in range(cfg.num_layers) if cfg.moe is not None and cfg.moe.is_sparse(i)]


@contextlib.contextmanager
def recording():
    """moe.route and moe.choose wrapped; yields a list that gets, per Switch layer call in
    order, numpy (first-choice expert [G, N], first choice kept [G, N], picks kept [G, N])."""
    calls, route0, choose0 = [], moe.route, moe.choose
    bind = inspect.signature(routing.route).bind

    def route(*args, **kwargs):
        r = route0(*args, **kwargs)
        a = bind(*args, **kwargs).arguments      # the same choice route made inside
        c = routing.choose(a["logits_GNE"], a["top_k"], valid_GN=a.get("valid_GN"),
                           bias_E=a.get("bias_E"))
        first_GN = c.index_GNP[..., 0]
        kept_GNE = jnp.sum(r.dispatch_GNEC, axis=-1)
        kept_GN = jnp.take_along_axis(kept_GNE, first_GN[..., None], -1)[..., 0] > 0
        calls.append(tuple(np.asarray(x) for x in (first_GN, kept_GN, kept_GNE.sum(-1))))
        return r

    def choose(*args, **kwargs):                 # moe's dropless path: every pick is served
        c = choose0(*args, **kwargs)
        first_GN = np.asarray(c.index_GNP[..., 0])
        calls.append((first_GN, np.ones(first_GN.shape, bool),
                      np.full(first_GN.shape, c.index_GNP.shape[-1])))
        return c

    moe.route, moe.choose = route, choose
    try:
        yield calls
    finally:
        moe.route, moe.choose = route0, choose0


def capture(model, cfg, layout, batch) -> list[dict]:
    """One eager evaluation-mode forward pass; per Switch layer {"expert", "kept", "picks_kept"}
    as [B, L] arrays (expert -1 at padding)."""
    B, L = batch["inputs"].shape
    valid = batch["segments"] > 0
    with recording() as calls:
        steps.forward(model, cfg, layout, {k: jnp.asarray(v) for k, v in batch.items()})
    if len(calls) != len(switch_layers(cfg)):
        raise RuntimeError(f"recorded {len(calls)} routings for {len(switch_layers(cfg))} "
                           "Switch layers (experts-choose routing is not recorded)")
    out = []
    for first, kept, picks in calls:
        assert first.size == B * L, (first.shape, B, L)      # groups tile batch x length
        out.append({"expert": np.where(valid, first.reshape(B, L), -1),
                    "kept": kept.reshape(B, L) & valid, "picks_kept": picks.reshape(B, L)})
    return out


def contingency(experts, ids, num_experts):
    """counts [distinct ids, E] and the distinct ids."""
    uniq, row = np.unique(ids, return_inverse=True)
    table = np.bincount(row * num_experts + experts, minlength=len(uniq) * num_experts)
    return table.reshape(len(uniq), num_experts), uniq


def determinism(table) -> float:
    n_t = table.sum(1)
    seen = n_t >= MIN_COUNT             # none seen: 0
    return float(table[seen].max(1).sum() / max(n_t[seen].sum(), 1))


def nmi(table) -> float:
    """I(E;T) / H(E), plug-in, in nats over nats."""
    p = table / table.sum()
    p_t, p_e = p.sum(1, keepdims=True), p.sum(0, keepdims=True)
    nz = p > 0
    mi = float(np.sum(p[nz] * np.log(p[nz] / (p_t @ p_e)[nz])))
    h_e = float(-np.sum(p_e[p_e > 0] * np.log(p_e[p_e > 0])))
    return mi / h_e if h_e > 0 else 0.0


def with_baseline(fn, experts, ids, num_experts, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    shuffled = [fn(contingency(rng.permutation(experts), ids, num_experts)[0])
                for _ in range(SHUFFLES)]
    return {"value": round(fn(contingency(experts, ids, num_experts)[0]), 4),
            "baseline": round(float(np.mean(shuffled)), 4)}


def top_pieces(experts, ids, num_experts, piece=str, k=PIECES) -> list[list[dict]]:
    """Per expert, its k most over-represented ids (seen >= MIN_COUNT): count / expected."""
    table, uniq = contingency(experts, ids, num_experts)
    n_t, n_e = table.sum(1), table.sum(0)
    ratio = table / np.maximum(np.outer(n_t, n_e) / table.sum(), 1e-12)
    ratio[n_t < MIN_COUNT] = 0.0
    out = []
    for e in range(num_experts):
        order = np.lexsort((-table[:, e], -ratio[:, e]))[:k]
        out.append([{"piece": piece(int(uniq[i])), "ratio": round(float(ratio[i, e]), 2),
                     "count": int(table[i, e])} for i in order if ratio[i, e] > 0])
    return out


def layer_stats(c: dict, num_experts: int, top_k: int, piece=str) -> dict:
    """Every statistic of one layer from ``c``, flat arrays over its valid tokens: "expert" (first
    choice), "id", "context", "kept" (first choice), "picks_kept"."""
    experts, ids = c["expert"], c["id"]
    load = np.bincount(experts, minlength=num_experts) / len(experts)
    n_t = contingency(experts, ids, num_experts)[0].sum(1)
    return {"tokens": int(len(experts)), "load": load.round(4).tolist(),
            "dropped": round(float(1 - c["kept"].mean()), 5),
            "dropped_picks": round(float(1 - c["picks_kept"].sum() / (top_k * len(experts))), 5),
            "ids": int(len(n_t)), "ids_seen_5": int((n_t >= MIN_COUNT).sum()),
            "tokens_of_ids_seen_5": round(float(n_t[n_t >= MIN_COUNT].sum() / n_t.sum()), 4),
            "determinism": with_baseline(determinism, experts, ids, num_experts),
            "nmi_token": with_baseline(nmi, experts, ids, num_experts),
            "nmi_context": with_baseline(nmi, experts, c["context"], num_experts),
            "pieces": top_pieces(experts, ids, num_experts, piece)}


def analyse(workdir: pathlib.Path, corpus: pathlib.Path, sequences: int) -> dict:
    if not (workdir / "config.json").is_file():
        raise Bad(f"{workdir} is not a train.py workdir (no config.json); pass --workdir of a "
                  "trained Switch LM run, e.g. runs/lm/switch_8")
    config = harness.held_out_config(workdir, corpus,
                                     {"data.max_eval_examples": str(sequences)})
    cfg = evaluate.run_model(config, workdir, vocab_size=1) if config.task == "lm" else None
    why = (f"trained task '{config.task}', not a decoder-only LM" if cfg is None else
           "is a dense model with no Switch layer" if not switch_layers(cfg) else
           "routes experts-choose (no token picks an expert)" if cfg.moe.experts_choose(False)
           else "")           # run_model: the run's layers (the vocabulary does not matter here)
    if why:
        raise Bad(f"{workdir} ({config.model}) {why}; pass the workdir of a trained top-k "
                  "Switch LM run, e.g. runs/lm/switch_8")
    ds, setup, params, step = harness.restore_held_out(config, workdir, task="lm")
    cfg = setup.cfg.replace(scan_layers=False, remat="none")    # layer by layer, no tracing
    model = nnx.merge(state_lib.abstract_model(cfg)[0], transformer.layers_as(params, cfg))
    sp = spm.SentencePieceProcessor(model_proto=ds.tokenizer.proto)
    piece = lambda i: sp.id_to_piece(i) if i < sp.get_piece_size() else f"<id {i}>"  # noqa

    layers, parts = switch_layers(cfg), [[] for _ in switch_layers(cfg)]
    start = time.perf_counter()
    for batch in ds.eval_batches():
        valid = batch["segments"] > 0
        context = np.pad(batch["inputs"], ((0, 0), (1, 0)), constant_values=-1)[:, :-1]
        for j, rec in enumerate(capture(model, cfg, setup.layout, batch)):
            parts[j].append({**{k: v[valid] for k, v in rec.items()},
                             "id": batch["inputs"][valid], "context": context[valid]})
    seconds = time.perf_counter() - start
    E, k = cfg.moe.num_experts, cfg.moe.top_k
    stats = [{"layer": layer, **layer_stats({n: np.concatenate([p[n] for p in part])
                                             for n in part[0]}, E, k, piece)}
             for layer, part in zip(layers, parts)]
    return {"workdir": str(workdir), "step": step, "model": config.model, "num_experts": E,
            "top_k": k, "statistics_of": "first choice" if k > 1 else "the one choice",
            "eval_capacity_factor": cfg.moe.eval_capacity_factor,
            "group_size": cfg.moe.group_size, "sequences": len(ds.eval_examples),
            "forward_seconds": round(seconds, 2), "layers": stats}


def markdown(runs: list[dict]) -> str:
    pair = lambda s: f"{s['value']:.3f} ({s['baseline']:.3f})"  # noqa: E731
    lines = ["| run | layer | E | k | tokens | max load | dropped | determinism (shuffled) "
             "| NMI(E;token) (shuffled) | NMI(E;prev token) (shuffled) |", "|---" * 10 + "|"]
    lines += [f"| {pathlib.Path(r['workdir']).name} | {s['layer']} | {r['num_experts']} | "
              f"{r['top_k']} | {s['tokens']} | {max(s['load']):.3f} | {s['dropped']:.4f} | "
              f"{pair(s['determinism'])} | {pair(s['nmi_token'])} | {pair(s['nmi_context'])} |"
              for r in runs for s in r["layers"]]
    for r in runs:
        for s in r["layers"]:
            lines.append(f"\n{pathlib.Path(r['workdir']).name}, layer {s['layer']}: most "
                         "over-represented pieces (x count in expert / expected)"
                         + ("; the 8 most loaded experts, all in the JSON"
                            if r["num_experts"] > 8 else ""))
            for e in np.argsort(s["load"])[::-1][:8]:
                pieces = " ".join(f"{p['piece']!r}x{p['ratio']:g}" for p in s["pieces"][e])
                lines.append(f"- e{e} ({s['load'][e]:.1%}): {pieces}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = workdir_report.parser(__doc__, "specialisation", count="sequences")
    return workdir_report.run(
        p, argv, "specialisation", lambda w, args: analyse(w, args.corpus, args.sequences),
        markdown, count="sequences",
        fields=lambda args: {"min_count": MIN_COUNT, "shuffles": SHUFFLES})


if __name__ == "__main__":
    workdir_report.exit_with(main())
