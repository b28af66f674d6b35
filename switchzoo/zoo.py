"""The model zoo: name -> ModelConfig, read from the catalogue in models/ (data, not code);
parameter counts and forward FLOPs per token from abstract shapes (nothing is allocated).

    python -m switchzoo.zoo [--json] [--seq-len 512] [NAME ...]

prints name, parameters (with the published figure and whether it agrees), experts, FLOPs per
token and source of every catalogue entry.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import re
import sys

from switchzoo import registry
from switchzoo.config import ModelConfig, MoeConfig

CATALOGUE = "switchzoo.models"                # the catalogue package (models/ in a clone)
META_KEYS = ("source", "published", "note")   # catalogue keys that are not ModelConfig fields
SEQ_LEN = 512                                   # attended length for flops_per_token
_UNITS = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


def _entries() -> dict[str, dict]:
    entries: dict[str, dict] = {}
    # switch.py first, so the catalogue opens with its tiny entries.
    for module in registry.modules(CATALOGUE, first="switch"):
        for name, entry in module.MODELS.items():
            if name in entries:
                raise ValueError(f"model '{name}' is defined twice in {CATALOGUE}; rename one")
            entries[name] = entry
    return entries


def names() -> list[str]:
    return list(_entries())


def entry(name: str) -> dict:
    """The catalogue entry: hyper-parameters plus 'source', 'published' figures and 'note'."""
    return registry.lookup(_entries(), name, "model")


def get(name: str) -> ModelConfig:
    """The ModelConfig of a catalogue entry."""
    hp = {k: v for k, v in entry(name).items() if k not in META_KEYS}
    moe = hp.pop("moe", None)
    return ModelConfig(**hp, moe=MoeConfig(**moe) if moe is not None else None)


def _config(name_or_cfg: str | ModelConfig) -> ModelConfig:
    return get(name_or_cfg) if isinstance(name_or_cfg, str) else name_or_cfg


@functools.lru_cache(maxsize=None)
def _param_shapes(cfg: ModelConfig) -> tuple[tuple[str, tuple[str, ...], tuple[int, ...]], ...]:
    """(stack, logical dims, shape) of every parameter (stack: the first key of its path,
    'encoder' / 'decoder' / ...), traced with nnx.eval_shape: no allocation, so Switch-C's 1.6T
    parameters take about a second."""
    from flax import nnx

    from switchzoo import transformer
    model = nnx.eval_shape(lambda: transformer.build(cfg))
    return tuple((str(path[0]), v.get_metadata()["dims"], tuple(v.shape))
                 for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param)))


def count_params(name_or_cfg: str | ModelConfig) -> int:
    """Number of parameters of a catalogue name or a ModelConfig, from abstract shapes."""
    return sum(math.prod(shape) for _, _, shape in _param_shapes(_config(name_or_cfg)))


def served_picks(moe: MoeConfig, encoder: bool = False, seq_len: int = SEQ_LEN) -> float:
    """The experts one token is served by on average in training: at most the slots there are.

    A group of N tokens has E x C slots (C = moe.capacity(N): round(N x train capacity factor
    / E), at least min_capacity; a fixed expert_capacity as it is), whatever top_k is: top-k's
    k x N picks share them, so at most E x C / N picks a token are served (about the capacity
    factor), and never more than k. Tokens-choose: min(top_k, E x C / N), where every slot
    is filled (the drops measured in training, dropped_fraction, take the rest off); dropless
    dispatch: top_k (nothing dropped). Experts-choose: E x C / N, every slot filled by
    construction. N is moe.group_size (seq_len where it is 0: one group per sequence); a batch
    smaller than a group routes smaller groups, with the same factor up to rounding.
    E.g. top-2 at capacity 1.25: 1.25 picks a token, not 2; at 2.0: 2."""
    n = moe.group_size or seq_len
    experts_choose = moe.experts_choose(encoder)
    slots = moe.num_experts * min(moe.capacity(n, True, experts_choose), n) / n
    if experts_choose:
        return slots
    return float(moe.top_k) if moe.dispatch == "dropless" else min(float(moe.top_k), slots)


def flops_per_token(name_or_cfg: str | ModelConfig, seq_len: int = SEQ_LEN) -> float:
    """Forward matmul FLOPs per token (multiply-add = 2 FLOPs).

    2 x the weights one token is multiplied with: every dense and attention projection, the
    router, served_picks / num_experts of each expert weight (the experts that serve it: a
    top-2 router's second pick gets no FLOPs beyond the capacity slots, which top-1 and top-2
    share; capacity padding, slots left empty, is not counted), and the output layer (the tied
    embedding or lm_head; the embedding lookup is a gather, free). Plus, per attention layer,
    4 x seq_len x heads x d_kv for the scores (QK^T) and the weighted values (PV) over
    ``seq_len`` keys, without a causal discount. Norms, softmaxes and position biases are left
    out. An encoder-decoder counts one source and one target token, both sequences ``seq_len``
    long: its FLOPs per sequence pair are seq_len x this.
    """
    cfg = _config(name_or_cfg).replace(scan_layers=False)   # per-layer shapes: no 'layers' dim

    def visited(stack: str) -> float:          # the share of each expert weight a token uses
        return served_picks(cfg.moe, stack == "encoder", seq_len) / cfg.moe.num_experts
    flops = 0.0
    for stack, dims, shape in _param_shapes(cfg):
        if len(shape) < 2 or "relpos_buckets" in dims:
            continue                                  # norm scales, relative-position biases
        if dims == ("vocab", "d_model") and not cfg.tie_embeddings:
            continue                                  # input embedding: a gather
        weights = math.prod(shape) * (visited(stack) if dims[0] == "experts" else 1.0)
        flops += 2 * weights
        if dims == ("heads", "d_kv", "d_model"):      # one output projection per attention
            flops += 4 * seq_len * shape[0] * shape[1]
    return flops


def agrees(count: int, figure: str) -> bool:
    """Whether ``count`` rounds to a published ``figure`` ('0.2B', '223M', '1571B', '4.90B') at
    the precision it was printed with."""
    m = re.fullmatch(r"(\d+(?:\.(\d+))?)([KMBT])", figure)
    if m is None:
        raise ValueError(f"published figure '{figure}' is not a number with a K/M/B/T suffix, "
                         "e.g. '7.4B' or '223M'")
    return round(count / _UNITS[m[3]], len(m[2] or "")) == float(m[1])


def human(n: float) -> str:
    """3 significant digits with a K/M/B/T suffix: 7415217408 -> '7.42B'."""
    for unit in "TBMK":
        if abs(n) >= _UNITS[unit]:
            return f"{n / _UNITS[unit]:.3g}{unit}"
    return f"{n:.3g}"


def describe(name: str, seq_len: int = SEQ_LEN) -> dict:
    """One row of the CLI: counts, experts, FLOPs per token, published figure and source."""
    cfg, meta = get(name), entry(name)
    published = meta.get("published", {})
    params = count_params(cfg)
    return {
        "name": name,
        "params": params,
        "published_params": published.get("params"),
        "agrees": agrees(params, published["params"]) if "params" in published else None,
        "mismatch": published.get("mismatch"),
        "experts": cfg.moe.num_experts if cfg.moe else 0,
        "flops_per_token": flops_per_token(cfg, seq_len),
        "source": meta.get("source", ""),
    }


def _verdict(row: dict) -> str:
    if not row["published_params"]:
        return "-"
    word = "ok" if row["agrees"] else "noted" if row["mismatch"] else "DIFFERS"
    return f"{row['published_params']} {word}"


def _table(rows: list[dict], width: int = 70) -> str:
    """Text table; 'noted' marks a published figure the catalogue explains it cannot match."""
    header = ("name", "params", "published", "experts", "FLOPs/token", "source")
    cells = [header] + [(
        r["name"], human(r["params"]), _verdict(r),
        str(r["experts"] or "-"), human(r["flops_per_token"]),
        r["source"] if len(r["source"]) <= width else r["source"][:width - 3] + "...",
    ) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1]
                     for row in cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m switchzoo.zoo", description=(
        "List the model zoo: parameters from abstract shapes, experts, forward FLOPs per token "
        "(see switchzoo.zoo.flops_per_token) and sources."))
    parser.add_argument("names", nargs="*", help="catalogue names (default: all)")
    parser.add_argument("--json", action="store_true", help="print a JSON list of rows")
    parser.add_argument("--seq-len", type=int, default=SEQ_LEN,
                        help=f"attended length for the attention FLOPs (default {SEQ_LEN})")
    args = parser.parse_args(argv)
    try:
        rows = [describe(n, args.seq_len) for n in args.names or names()]
    except ValueError as e:
        parser.error(str(e))
    print(json.dumps(rows, indent=1) if args.json else _table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
