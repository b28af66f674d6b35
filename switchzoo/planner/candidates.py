"""The layout search's candidates: meshes (ordered factorisations of N over the axes) and
layouts (each of batch, experts, heads, d_ff, vocab on an axis, several, or none), enumerated
with the pruning that needs no model but its sizes (switchzoo/planner/search.py).

A mesh axis named ``stage`` (``--axes stage,data,model,expert``) is a pipeline's
(switchzoo/pipeline.py): where it is larger than 1 the candidate's layout gets ``layers:stage``
and nothing else goes on that axis; its size must divide each stack's scanned layer groups
(x the schedule's repeats), and the candidate carries the micro-batch count it is compiled
with (``microbatches``: the one asked for, else 4 x stages lowered to what the batch allows)."""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math

DIMS = ("batch", "experts", "heads", "d_ff", "vocab")
MODEL_DIMS = ("heads", "d_ff", "vocab")
HOME = {"batch": "data", "experts": "expert", "heads": "model", "d_ff": "model",
        "vocab": "model"}
STAGE = "stage"             # the mesh axis the search pipelines the layers over ('layers:stage')
MICROBATCHES_PER_STAGE = 4  # the default micro-batch count: 4 x stages, if the batch allows


def microbatches_for(batch: int, stages: int, batch_parts: int, requested: int = 0,
                     repeats: int = 1) -> int | None:
    """A pipeline's micro-batch count for ``batch`` sequences (per accumulation step) on
    ``stages`` stages whose batch axes split each micro-batch ``batch_parts`` ways:
    ``requested`` where the batch divides into that many micro-batches the batch axes split
    evenly (and, circular, at least one per stage); with none requested (0), the largest such
    count up to 4 x stages; None where there is none."""
    def ok(m: int) -> bool:
        return (m >= 1 and batch % m == 0 and (batch // m) % batch_parts == 0
                and (repeats == 1 or m >= stages))
    if requested:
        return requested if ok(requested) else None
    return next((m for m in range(MICROBATCHES_PER_STAGE * stages, 0, -1) if ok(m)), None)


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
    microbatches: int = 0       # pipelined ('layers' split over a stage axis): M; else unused
    repeats: int = 1            # pipelined: rounds R (1: GPipe)

    @property
    def stages(self) -> int:
        """Pipeline stages S (1: not pipelined)."""
        return self.parts("layers")

    @property
    def iterations(self) -> int:
        """Per step, each stage's iterations: R M + S - 1 (1 unpipelined)."""
        if self.stages == 1:
            return 1
        return self.repeats * self.microbatches + self.stages - 1

    @property
    def bubble(self) -> float:
        """Executed / useful work on a stage: (R M + S - 1) / (R M) (1 unpipelined)."""
        if self.stages == 1:
            return 1.0
        return self.iterations / (self.repeats * self.microbatches)

    @property
    def mesh_text(self) -> str:
        return ",".join(f"{a}:{n}" for a, n in self.mesh)

    @property
    def layout_text(self) -> str:
        return ",".join(f"{d}:{'+'.join(a)}" for d, a in self.rules if a)

    @functools.cached_property
    def _split(self) -> tuple[dict, dict]:
        """(dim -> its axes, dim -> its parts), computed once (the estimate asks often)."""
        sizes, rules = dict(self.mesh), dict(self.rules)
        return rules, {d: math.prod(sizes[a] for a in axes) for d, axes in rules.items()}

    def parts(self, dim: str) -> int:
        return self._split[1].get(dim, 1)

    def axes(self, dim: str) -> tuple[str, ...]:
        return self._split[0].get(dim, ())

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
        key = tuple(sorted(map(tuple, merged)) if not ordered else map(tuple, merged))
        piped = any(d == "layers" and axes for d, axes in self.rules)
        return key + ((("pipeline", self.microbatches, self.repeats),) if piped else ())


@dataclasses.dataclass
class Sizes:
    """The model's and the run's dimension sizes the enumeration checks."""
    batch: int              # sequences per micro-batch
    heads: int
    d_ff: int
    vocab: int
    experts: int            # 0: dense
    groups: tuple[int, ...] = ()    # each stack's scanned layer groups (none: not scanned)

    def of(self, dim: str) -> int:
        return getattr(self, dim)


def _layouts(dims: list[str], options: list[tuple], divides) -> tuple[list[tuple], int]:
    """(the layouts, one option per dim in itertools.product's order, in which no tensor is
    split twice over one axis and every dim divides over its axes; how many of the product
    split no tensor twice). Twice: batch with heads, d_ff or vocab (activations carry both),
    experts with d_ff (the expert weights). ``divides(dim, option)``. Built without visiting
    the rest of the product, which is most of it."""
    fits = {d: [o for o in options if divides(d, o)] for d in dims}
    out, single = [], 0
    for batch in options:
        free = [o for o in options if not set(o) & set(batch)]
        if "experts" in dims:        # d_ff and experts share no axis; heads, vocab: free
            single += sum(1 for f in free for e in options if not set(e) & set(f)) * len(
                free) ** (len(dims) - 3)
        else:
            single += len(free) ** (len(dims) - 1)
        if batch not in fits["batch"]:
            continue
        lists = [[batch] if d == "batch" else [o for o in free if o in fits[d]]
                 if d in MODEL_DIMS else fits[d] for d in dims]
        for choice in itertools.product(*lists):
            rules = dict(zip(dims, choice))
            if "experts" not in rules or not set(rules["experts"]) & set(rules["d_ff"]):
                out.append(choice)
    return out, single


def enumerate_candidates(n: int, axes: tuple[str, ...], sizes: Sizes,
                         fixed: dict[str, int] | None = None, ordered: bool = True,
                         microbatches: int = 0, repeats: int = 1):
    """(candidates, pruned counts by reason). A ``stage`` axis in ``axes`` pipelines the
    layers (module doc): ``microbatches`` (0: 4 x stages, or fewer as the batch allows) and
    ``repeats`` are the pipeline's."""
    fixed = fixed or {}
    dims = [d for d in DIMS if d != "experts" or sizes.experts]
    pruned = {"indivisible": 0, "axis used twice in one tensor": 0, "unused mesh axis": 0,
              "same as another up to axis names": 0}
    if STAGE in axes:
        pruned["stages not dividing the layer groups"] = 0
    best: dict[tuple, tuple[int, Candidate]] = {}
    for shape in factorisations(n, len(axes)):
        if any(shape[axes.index(a)] != s for a, s in fixed.items()):
            continue
        mesh = tuple(zip(axes, shape))
        sizes_of = dict(mesh)
        stages = sizes_of.get(STAGE, 1)
        live = [a for a, s in mesh if s > 1 and a != STAGE]     # the stage axis: layers only
        options = _subsets(live)
        if stages > 1 and (not sizes.groups or any(g % (stages * repeats)
                                                   for g in sizes.groups)):
            pruned["stages not dividing the layer groups"] += len(options) ** len(dims)
            continue
        pipe = ((("layers", (STAGE,)),) if stages > 1 else ())
        parts = {o: math.prod(sizes_of[a] for a in o) for o in options}
        layouts, single = _layouts(dims, options, lambda d, o: sizes.of(d) % parts[o] == 0)
        pruned["axis used twice in one tensor"] += len(options) ** len(dims) - single
        pruned["indivisible"] += single - len(layouts)
        for choice in layouts:
            rules = dict(zip(dims, choice))
            m = 0
            if stages > 1:
                m = microbatches_for(sizes.batch, stages, parts[rules["batch"]],
                                     microbatches, repeats)
                if m is None:
                    pruned["indivisible"] += 1
                    continue
            if set(live) - set().union(*map(set, rules.values())):
                pruned["unused mesh axis"] += 1
                continue
            cand = Candidate(mesh, tuple((d, rules[d]) for d in dims) + pipe, m,
                             repeats if stages > 1 else 1)
            home = (sum(HOME[d] in rules[d] for d in dims), -len(live))   # usual names, fewer axes
            k = cand.key(ordered)
            if k in best:
                pruned["same as another up to axis names"] += 1
                if home <= best[k][0]:
                    continue
            best[k] = (home, cand)
    return [c for _, c in best.values()], pruned
