"""The layout search's analytic estimate of one candidate: per-device state and activations, the
matmul FLOPs (each stack at its own length: an encoder-decoder's encoder reads the inputs, its
decoder the targets; Switch layers by the capacity slots they fill, whatever top_k is) and the
collectives the layout implies, priced by the same cost model as a compiled program
(switchzoo/planner/hardware.py), each group placed on hosts and chips by its mesh axes and the
mesh order. It orders the candidates to compile and feeds the advice; the compiled program
decides the ranking.

A pipelined candidate (its 'layers' split over S stages, M micro-batches, R rounds; I = R M +
S - 1 iterations per step, bubble factor f = I / (R M)) is priced as switchzoo/pipeline.py runs
it: each device holds and computes its stage's layers (stacked parameters / S; their FLOPs / S x
f: the bubble's stages compute on dummy data), the layers' own collectives run per iteration on
one micro-batch (so their bytes are / S x f), each stack hands one micro-batch's activation
(and its masks; a decoder's encoder output) to the next stage by a collective-permute per
iteration forward and its gradient back (two permutes, as XLA compiles a roll's transpose),
the last stage's output is all-reduced over the stage axis per iteration (forward) and the
stage-0 input's gradient (backward), and for R > 1 every stacked parameter crosses the stage
axis by an all-to-all per step and its gradient back. What sits outside the stacks (embedding,
output layer, loss) runs on every stage for its batch rows. docs/layout_search_pipeline.md
states the formulas.
"""
from __future__ import annotations

import dataclasses
import functools
import math

from switchzoo.layout import experts_cut
from switchzoo.planner import hardware, hlo
from switchzoo.planner.candidates import DIMS, HOME, Candidate, Sizes, microbatches_for

SPLIT = DIMS + ("layers",)      # the dims a candidate may split a parameter on


@dataclasses.dataclass(frozen=True)
class Weight:
    """One parameter as the estimate sees it. ``role``: "proj" (applied to each token of its
    stack), "source" (a cross-attention key / value: applied to each input token), "router",
    "expert" (applied to each capacity slot), "output" (each target token) or "none" (norms,
    position biases, the embedding lookup: no matmul)."""
    stack: str
    role: str
    dims: tuple[str, ...]
    elements: int


def weight_role(path: str, dims: tuple[str, ...], tied: bool) -> str:
    named = tuple(d for d in dims if d != "layers")
    if len(named) < 2 or "relpos_buckets" in named:
        return "none"
    if named == ("vocab", "d_model"):
        return "output" if tied else "none"
    if "vocab" in named:
        return "output"
    if "experts" in named:
        return "expert" if "d_ff" in named else "router"
    return "source" if "/cross/k" in path or "/cross/v" in path else "proj"


@dataclasses.dataclass(frozen=True)
class Stack:
    """One stack's share of a step: its length, its layers, and per token of its Switch layers
    the capacity slots served (what MFU counts: at most top_k picks, at most the slots) and
    computed (every slot, empty ones too, as the capacity dispatch runs them)."""
    name: str
    length: int
    layers: int
    sparse_layers: int
    served: float
    computed: float
    dispatch: str = "index"  # how its Switch layers dispatch: index | einsum | dropless
    group: int = 0           # tokens per routing group


def stack_slots(moe, encoder: bool, batch: int, length: int) -> tuple:
    """(served, computed, dispatch, group) of a stack's Switch layers: slots per token, from
    the groups the run forms of ``batch`` sequences (switchzoo.moe: C slots per expert per
    group of N tokens, whatever top_k is)."""
    from switchzoo import moe as moe_lib
    choose = moe.experts_choose(encoder)
    try:
        n = batch * length // moe_lib.num_groups(batch, length, moe.group_size)
    except ValueError:
        n = min(moe.group_size or length, batch * length)
    c = min(moe.capacity(n, True, choose), n)
    if not choose and (moe.dispatch == "dropless" or (moe.dispatch == "auto" and c == n)):
        return float(moe.top_k), float(moe.top_k), "dropless", n   # every pick, no slots
    slots = moe.num_experts * c / n
    return (slots if choose else min(float(moe.top_k), slots), slots,
            "einsum" if moe.dispatch == "einsum" else "index", n)


@dataclasses.dataclass
class Model:
    """What the analytic estimate needs of the run, computed once."""
    cfg: object
    weights: list[Weight]
    stacks: tuple[Stack, ...]  # input (encoder) first; the last stack reads the targets
    opt_per_param: float     # optimizer-state bytes per parameter byte (from the real optimizer)
    shard_update: bool       # optimizer state also split over the batch axes
    batch: int               # global sequences per step
    act_bytes: int
    remat: str
    accumulate: int = 1      # micro-batches per step: activations of one micro-batch live
    groups: tuple[int, ...] = ()     # each stack's scanned layer groups (none: not scanned)
    pipeline_microbatches: int = 0   # a pipelined candidate's M as asked (0: 4 x stages ...)
    pipeline_repeats: int = 1        # ... and its rounds R

    def sizes(self) -> Sizes:
        """The dimension sizes the enumeration checks."""
        cfg = self.cfg
        return Sizes(self.batch // self.accumulate, cfg.num_heads, cfg.d_ff, cfg.vocab_size,
                     cfg.moe.num_experts if cfg.moe else 0, self.groups)

    def pipelined(self, c: Candidate) -> Candidate | None:
        """``c`` with the micro-batches and rounds its pipeline runs (``c`` itself where it has
        no stage axis); None where its stages do not divide the layer groups x rounds or the
        batch does not divide into micro-batches its batch axes split."""
        s = c.stages
        if s == 1:
            return c
        r = self.pipeline_repeats
        if not self.groups or any(g % (s * r) for g in self.groups):
            return None
        m = microbatches_for(self.batch // self.accumulate, s, c.parts("batch"),
                             self.pipeline_microbatches, r)
        return None if m is None else dataclasses.replace(c, microbatches=m, repeats=r)

    def stacks_for(self, c: Candidate | None) -> tuple[Stack, ...]:
        """The stacks as ``c`` runs them: a pipeline forms its routing groups (and so its
        capacity slots) within each of its micro-batches."""
        if c is None or c.stages == 1:
            return self.stacks
        key = c.microbatches
        cache = self.__dict__.setdefault("_stacks_by_microbatch", {})
        if key not in cache:
            cache[key] = stacks_of(self.cfg, self.lengths,
                                   max(self.batch // self.accumulate // key, 1))
        return cache[key]

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(s.length for s in self.stacks)

    @property
    def passes(self) -> int:
        """Forward + backward (2 x forward) + full remat's recompute, in forward passes."""
        return 4 if self.remat == "full" else 3

    def _length(self, w: Weight) -> int:
        if w.role == "source":
            return self.stacks[0].length
        if w.role == "output":
            return self.stacks[-1].length
        return next((s.length for s in self.stacks if s.name == w.stack), self.stacks[-1].length)

    def forward_flops(self, c: Candidate | None = None, computed: bool = False) -> float:
        """Matmul FLOPs of one forward pass over the step's batch: all devices' (``c`` None)
        or one device's under candidate ``c``. Experts count the slots served (``computed``:
        every slot, as the capacity dispatch runs them, plus the dispatch's own matmuls)."""
        cfg = self.cfg
        seqs = self.batch / (c.parts("batch") if c else 1)
        batch_axes = set(c.axes("batch")) if c else set()
        sizes = dict(c.mesh) if c else {}
        stacks = self.stacks_for(c)
        # a pipeline: each device runs its stage's layers (1 / S) for R M + S - 1 iterations
        layered = (c.bubble / c.stages) if c else 1.0
        flops = 0.0
        for w in self._merged:
            if w.role == "none":
                continue
            own = {a for d in set(w.dims) if d in SPLIT for a in c.axes(d)} if c else set()
            per_token = 2 * w.elements / math.prod(sizes[a] for a in own - batch_axes)
            if c and "layers" in w.dims:
                per_token *= c.bubble           # the stage axis is in ``own``: / S already
            if w.role == "expert":
                s = next((s for s in stacks if s.name == w.stack), stacks[-1])
                per_token *= (s.computed if computed else s.served) / cfg.moe.num_experts
            flops += per_token * seqs * self._length(w)
        heads = cfg.num_heads * cfg.d_kv / (c.parts("heads") if c else 1)
        enc = stacks[0] if len(stacks) == 2 else None
        for s in stacks:        # scores and weighted values: 4 Lq Lk H K per attention
            keys = [s.length] + ([enc.length] if enc and s is not enc else [])
            flops += layered * s.layers * sum(4 * s.length * k * heads for k in keys) * seqs
        for s in stacks if computed and cfg.moe else ():
            tokens = layered * s.sparse_layers * seqs * s.length
            if s.dispatch == "einsum":        # one-hot masks: 2 N (E C) D per group each way
                flops += 2 * 2 * tokens * s.group * s.computed * cfg.d_model
            elif s.dispatch == "index" and not cfg.moe.experts_choose(s.name == "encoder"):
                flops += 2 * tokens * cfg.moe.top_k * cfg.d_model    # gate-weighted sum
        return flops

    @property
    def model_flops(self) -> float:
        """Per step, forward + backward, all devices: what MFU counts."""
        return 3 * self.forward_flops()

    def state_bytes(self, c: Candidate) -> int:
        """Parameters + gradients (+ their sum over micro-batches) + optimizer state per device
        (float32), from the layout; the optimizer state under weight-update sharding is split
        evenly over the batch axes (an average: a leaf no free dimension divides stays whole)."""
        total = 0.0
        bparts = c.parts("batch")
        grads = 2 if self.accumulate > 1 else 1       # + the accumulated sum
        for dims, elements in self._elements_by_split.items():    # a pipeline's stacked
            parts = math.prod(c.parts(d) for d in dims)            # parameters: / S ('layers')
            weights = 4 * elements / parts
            total += (1 + grads) * weights + weights * self.opt_per_param / (
                bparts if self.shard_update else 1)
        return int(total)

    @functools.cached_property
    def _merged(self) -> list[Weight]:
        """The weights merged where the estimate cannot tell them apart (one stack, one role,
        the same dims a layout may split): fewer terms to sum per candidate."""
        out: dict[tuple, int] = {}
        for w in self.weights:
            key = (w.stack, w.role, tuple(sorted(d for d in set(w.dims) if d in SPLIT)))
            out[key] = out.get(key, 0) + w.elements
        return [Weight(stack, role, dims, n) for (stack, role, dims), n in out.items()]

    @functools.cached_property
    def _elements_by_split(self) -> dict[tuple[str, ...], int]:
        """Parameter elements by the dims a layout may split them on (batch aside)."""
        out: dict[tuple[str, ...], int] = {}
        for w in self.weights:
            dims = tuple(sorted(d for d in set(w.dims) if d in SPLIT and d != "batch"))
            out[dims] = out.get(dims, 0) + w.elements
        return out

    def activation_bytes(self, c: Candidate) -> int:
        cfg, b = self.cfg, self.batch / c.parts("batch") / self.accumulate
        heads = cfg.num_heads / c.parts("heads") * cfg.d_kv
        ff = cfg.d_ff / c.parts("d_ff")
        if cfg.moe:
            ff = max(ff, cfg.moe.train_capacity_factor * cfg.d_ff / c.parts("d_ff"))
        if c.stages > 1:
            return int(self._pipelined_activations(c, b, heads, ff) + self._loop_gradients(c))
        total = 0.0
        for s in self.stacks:
            t = b * s.length
            full = t * (4 * cfg.d_model + 4 * heads + 2 * cfg.num_heads / c.parts("heads")
                        * s.length + 2 * ff) * self.act_bytes
            saved = t * cfg.d_model * self.act_bytes if self.remat == "full" else full
            total += s.layers * saved + full
        logits = b * self.stacks[-1].length * cfg.vocab_size / c.parts("vocab") * 4 * 3
        return int(total + logits)

    def _per_shard(self, c: Candidate) -> bool:
        """Whether switchzoo/pipeline.py runs ``c``'s stages per batch shard (each shard its
        own copy of the stage's weights or its own experts: the gradients reduced once a
        step), by the rule it applies to each expert FFN weight."""
        size = dict(c.mesh)
        axes_of = lambda d: tuple(a for a in c.axes(d) if size[a] > 1)   # noqa: E731
        return experts_cut([w.dims for w in self._merged], axes_of) is not None

    def _loop_gradients(self, c: Candidate) -> float:
        """A pipeline's parameter-sized temporaries: every iteration uses all of a stage's
        layers, so the backward loop adds each iteration's float32 gradient of the stage's
        stacked parameters into an accumulator (two buffers of their size), where a scan over
        unpipelined layers writes each layer's gradient once into its slice of the output.
        (Measured: XLA:CPU's temporaries rise by ~2x the stage's stacked parameters.)"""
        return 2 * sum(4 * n / math.prod(c.parts(d) for d in dims)
                       for dims, n in self._elements_by_split.items() if "layers" in dims)

    def _pipelined_activations(self, c: Candidate, b: float, heads: float, ff: float) -> float:
        """A pipelined step's activations per device (``b`` sequences of the step, or of one
        accumulation micro-batch, per device): what each of the stage's layers saves for the
        backward pass, for every micro-batch in flight, bubble iterations included (S-th of the
        layers x f = (R M + S - 1) / (R M) of the batch), one layer's working set for one
        micro-batch, the stage's inputs and outputs of every iteration (and a decoder's encoder
        output and masks), and the logits, which every stage computes for its batch rows."""
        cfg, act = self.cfg, self.act_bytes
        mb = b / c.microbatches
        flight = c.bubble * c.repeats * b          # rows over the iterations: I x mb
        enc = self.stacks[0] if len(self.stacks) == 2 else None
        total = 0.0
        for s in self.stacks:
            full = mb * s.length * (4 * cfg.d_model + 4 * heads + 2 * cfg.num_heads
                                    / c.parts("heads") * s.length + 2 * ff) * act
            saved = (b * s.length * cfg.d_model * act if self.remat == "full"
                     else full * c.microbatches)
            total += s.layers / c.stages * c.bubble * saved + full
            keys = s.length + (enc.length if enc and s is not enc else 0)
            rows = s.length * (2 * cfg.d_model * act + keys)        # x in and out, masks
            if enc and s is not enc:
                rows += enc.length * cfg.d_model * act                # the encoder output
            total += flight * rows
        logits = b * self.stacks[-1].length * cfg.vocab_size / c.parts("vocab") * 4 * 3
        return total + logits

    def collectives(self, c: Candidate, profile: hardware.Profile) -> list[hlo.Collective]:
        """The collectives the layout implies, by their sizes, each placed on hosts by its mesh
        axes and the mesh order: gradient all-reduces over the batch axes a weight is not split
        on; per block, an all-reduce of its output over the model axes (heads; d_ff); per Switch
        layer, the dispatch and combine all-to-alls over the expert axes that split the tokens,
        and an all-reduce over those that do not."""
        sizes, cfg = dict(c.mesh), self.cfg
        batch_axes = set(c.axes("batch"))
        found: dict[tuple, list] = {}

        def add(kind: str, axes, nbytes: float, count: int):
            live = tuple(a for a, n in c.mesh if a in set(axes) and n > 1)
            if not live or nbytes <= 0 or count <= 0:
                return
            entry = found.setdefault((kind, live), [0.0, count])
            entry[0] += nbytes * count / entry[1]

        stacked = 0.0
        # a pipeline whose stages cannot run per batch shard reduces its stacked weights'
        # gradients in every iteration of its loop
        grads = c.iterations if c.stages > 1 and not self._per_shard(c) else 1
        for w in self._merged:
            own = {a for d in set(w.dims) if d in SPLIT for a in c.axes(d)}
            parts = math.prod(c.parts(d) for d in set(w.dims) if d in SPLIT and d != "batch")
            add("all-reduce", batch_axes - own, 4 * w.elements / parts,
                grads if "layers" in w.dims else 1)
            if "layers" in w.dims:
                stacked += 4 * w.elements / parts
        act = self.passes - 1                  # forward (+ recompute) and backward
        seqs = self.batch / c.parts("batch")
        stacks = self.stacks_for(c)
        enc = stacks[0] if len(stacks) == 2 else None
        # Pipelined: the layers' collectives run on the stage's layers (L = layers / (R S)
        # per iteration) in each of I iterations, on one micro-batch (seqs / M) each.
        S, I = c.stages, c.iterations
        M = c.microbatches if S > 1 else 1
        per = (lambda layers: layers * I // (c.repeats * S)) if S > 1 else (lambda layers: layers)
        for s in stacks:
            tokens = seqs / M * s.length * cfg.d_model * self.act_bytes
            attentions = 2 if enc and s is not enc else 1
            add("all-reduce", c.axes("heads"), tokens, act * per(s.layers) * attentions)
            add("all-reduce", c.axes("d_ff"), tokens, act * per(s.layers - s.sparse_layers))
            if cfg.moe and s.sparse_layers:
                experts = set(c.axes("experts"))
                add("all-to-all", experts & batch_axes, tokens * s.computed,
                    2 * act * per(s.sparse_layers))             # dispatch + combine
                add("all-reduce", c.axes("d_ff"), tokens * s.computed,
                    act * per(s.sparse_layers))
                add("all-reduce", experts - batch_axes, tokens, act * per(s.sparse_layers))
            if S > 1:
                stage = c.axes("layers")
                # per iteration, to the next stage: the activation and the rows that travel
                # with it (masks as bytes, a decoder's encoder output); its gradient back, which
                # XLA compiles as two permutes (a roll's transpose: the shift, and the
                # wrap-around from stage 0 to the last), each of the whole buffer
                keys = s.length + (enc.length if enc and s is not enc else 0)
                rows = seqs / M * s.length * (keys + 1)
                source = (seqs / M * enc.length * cfg.d_model * self.act_bytes
                          if enc and s is not enc else 0.0)
                add("collective-permute", stage, (3 * tokens + rows + 3 * source) / 3, 3 * I)
                # the last stage's output to every stage (forward), the stage-0 input's
                # gradient (backward; a decoder's encoder-output gradient with it)
                add("all-reduce", stage, (2 * tokens + source) / 2, 2 * I)
        if S > 1 and c.repeats > 1:            # stacked parameters into round-major blocks
            add("all-to-all", c.axes("layers"), stacked, 2)         # and their gradients back
        out = []
        for (kind, axes), (nbytes, count) in found.items():
            where = hardware.placement(tuple(c.mesh), axes, profile.devices_per_host,
                                       profile.devices_per_chip)
            out.append(hlo.Collective(kind, int(nbytes), math.prod(sizes[a] for a in axes),
                                      axes, where.crosses_hosts, int(count)))
        return out

    def program(self, c: Candidate, profile: hardware.Profile) -> hlo.Program:
        """The step as the estimate sees it, in the compiled program's terms."""
        return hlo.Program(self.collectives(c, profile),
                           int(self.passes * self.forward_flops(c, computed=True)))

    def step_seconds(self, c: Candidate, profile: hardware.Profile) -> float:
        return hardware.step_cost(self.program(c, profile), profile, c.mesh).step_s

    def simplicity(self, c: Candidate) -> tuple:
        """Tie-break: fewer split dimensions, then more on their usual axes."""
        return (sum(len(a) for _, a in c.rules),
                -sum(HOME.get(d) in a for d, a in c.rules))


def stacks_of(cfg, lengths: tuple[int, ...], batch: int) -> tuple[Stack, ...]:
    """The model's stacks at the run's lengths (inputs, targets) over ``batch`` sequences per
    micro-batch."""
    names = ("encoder", "decoder") if cfg.num_encoder_layers else ("decoder",)
    out = []
    for name, length in zip(names, lengths[-len(names):]):
        encoder = name == "encoder"
        layers = cfg.num_encoder_layers if encoder else cfg.num_layers
        sparse = sum(cfg.moe.is_sparse(i, encoder) for i in range(layers)) if cfg.moe else 0
        routed = stack_slots(cfg.moe, encoder, batch, length) if sparse else (0.0, 0.0)
        out.append(Stack(name, length, layers, sparse, *routed))
    return tuple(out)
