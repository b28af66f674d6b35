"""The layout search's candidates: meshes (ordered factorisations of N over the axes) and
layouts (each of batch, experts, heads, d_ff, vocab on an axis, several, or none), enumerated
with the pruning that needs no model but its sizes (switchzoo/layout/search.py)."""
from __future__ import annotations

import dataclasses
import itertools
import math

DIMS = ("batch", "experts", "heads", "d_ff", "vocab")
MODEL_DIMS = ("heads", "d_ff", "vocab")
HOME = {"batch": "data", "experts": "expert", "heads": "model", "d_ff": "model",
        "vocab": "model"}


def factorisations(n: int, k: int):
    """Every ordered k-tuple of positive integers whose product is n."""
    if k == 1:
        yield (n,)
        return
    for d in range(1, n + 1):
        if n % d == 0:
            for rest in factorisations(n // d, k - 1):
                yield (d,) + rest


def _subsets(axes):
    return [c for r in range(len(axes) + 1) for c in itertools.combinations(axes, r)]


@dataclasses.dataclass(frozen=True)
class Candidate:
    mesh: tuple[tuple[str, int], ...]           # (axis, size) in mesh order, sizes 1 included
    rules: tuple[tuple[str, tuple[str, ...]], ...]

    @property
    def mesh_text(self) -> str:
        return ",".join(f"{a}:{n}" for a, n in self.mesh)

    @property
    def layout_text(self) -> str:
        return ",".join(f"{d}:{'+'.join(a)}" for d, a in self.rules if a)

    def parts(self, dim: str) -> int:
        sizes = dict(self.mesh)
        return math.prod(sizes[a] for a in dict(self.rules).get(dim, ()))

    def axes(self, dim: str) -> tuple[str, ...]:
        return dict(self.rules).get(dim, ())

    def key(self, ordered: bool = True) -> tuple:
        """Name-free identity: per non-trivial axis, its size and its dims, in mesh order
        (``ordered``: where the order decides which axes cross hosts) or sorted. Axes that
        carry the same dimensions act as one axis of their product (neighbours, if ordered)."""
        axes = [(n, tuple(sorted(d for d, axes in self.rules if a in axes)))
                for a, n in self.mesh if n > 1]
        merged: list[list] = []
        for n, dims in (axes if ordered else sorted(axes, key=lambda x: x[1])):
            if merged and merged[-1][1] == dims:
                merged[-1][0] *= n
            else:
                merged.append([n, dims])
        return tuple(sorted(map(tuple, merged)) if not ordered else map(tuple, merged))


@dataclasses.dataclass
class Sizes:
    """The model's and the run's dimension sizes the enumeration checks."""
    batch: int              # sequences per micro-batch
    heads: int
    d_ff: int
    vocab: int
    experts: int            # 0: dense

    def of(self, dim: str) -> int:
        return getattr(self, dim)


def enumerate_candidates(n: int, axes: tuple[str, ...], sizes: Sizes,
                         fixed: dict[str, int] | None = None, ordered: bool = True):
    """(candidates, pruned counts by reason)."""
    fixed = fixed or {}
    dims = [d for d in DIMS if d != "experts" or sizes.experts]
    pruned = {"indivisible": 0, "axis used twice in one tensor": 0, "unused mesh axis": 0,
              "same as another up to axis names": 0}
    best: dict[tuple, tuple[int, Candidate]] = {}
    for shape in factorisations(n, len(axes)):
        if any(shape[axes.index(a)] != s for a, s in fixed.items()):
            continue
        mesh = tuple(zip(axes, shape))
        live = [a for a, s in mesh if s > 1]
        sizes_of = dict(mesh)
        options = _subsets(live)
        for choice in itertools.product(options, repeat=len(dims)):
            rules = dict(zip(dims, choice))
            batch = set(rules["batch"])
            if any(batch & set(rules[d]) for d in MODEL_DIMS) or (
                    "experts" in rules and set(rules["experts"]) & set(rules["d_ff"])):
                pruned["axis used twice in one tensor"] += 1
                continue
            if any(sizes.of(d) % math.prod(sizes_of[a] for a in rules[d]) for d in dims):
                pruned["indivisible"] += 1
                continue
            if set(live) - set().union(*map(set, rules.values())):
                pruned["unused mesh axis"] += 1
                continue
            cand = Candidate(mesh, tuple((d, rules[d]) for d in dims))
            home = (sum(HOME[d] in rules[d] for d in dims), -len(live))   # usual names, fewer axes
            k = cand.key(ordered)
            if k in best:
                pruned["same as another up to axis names"] += 1
                if home <= best[k][0]:
                    continue
            best[k] = (home, cand)
    return [c for _, c in best.values()], pruned
