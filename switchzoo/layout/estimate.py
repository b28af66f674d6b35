"""The layout search's analytic estimate of one candidate: per-device state and activations, the
matmul FLOPs (each stack at its own length: an encoder-decoder's encoder reads the inputs, its
decoder the targets; Switch layers by the capacity slots they fill, whatever top_k is) and the
collectives the layout implies, priced by the same cost model as a compiled program
(switchzoo/layout/hardware.py), each group placed on hosts and chips by its mesh axes and the
mesh order. It orders the candidates to compile and feeds the advice; the compiled program
decides the ranking.
"""
from __future__ import annotations

import dataclasses
import math

from switchzoo.layout import hardware, hlo
from switchzoo.layout.candidates import DIMS, HOME, Candidate


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

    def _stack(self, w: Weight) -> Stack:
        return next((s for s in self.stacks if s.name == w.stack), self.stacks[-1])

    def forward_flops(self, c: Candidate | None = None, computed: bool = False) -> float:
        """Matmul FLOPs of one forward pass over the step's batch: all devices' (``c`` None)
        or one device's under candidate ``c``. Experts count the slots served (``computed``:
        every slot, as the capacity dispatch runs them, plus the dispatch's own matmuls)."""
        cfg = self.cfg
        seqs = self.batch / (c.parts("batch") if c else 1)
        batch_axes = set(c.axes("batch")) if c else set()
        sizes = dict(c.mesh) if c else {}
        flops = 0.0
        for w in self.weights:
            if w.role == "none":
                continue
            own = {a for d in set(w.dims) if d in DIMS for a in c.axes(d)} if c else set()
            per_token = 2 * w.elements / math.prod(sizes[a] for a in own - batch_axes)
            if w.role == "expert":
                s = self._stack(w)
                per_token *= (s.computed if computed else s.served) / cfg.moe.num_experts
            flops += per_token * seqs * self._length(w)
        heads = cfg.num_heads * cfg.d_kv / (c.parts("heads") if c else 1)
        enc = self.stacks[0] if len(self.stacks) == 2 else None
        for s in self.stacks:   # scores and weighted values: 4 Lq Lk H K per attention
            keys = [s.length] + ([enc.length] if enc and s is not enc else [])
            flops += s.layers * sum(4 * s.length * k * heads for k in keys) * seqs
        for s in self.stacks if computed and cfg.moe else ():
            tokens = s.sparse_layers * seqs * s.length
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
        for w in self.weights:
            parts = math.prod(c.parts(d) for d in set(w.dims) if d in DIMS and d != "batch")
            weights = 4 * w.elements / parts
            total += (1 + grads) * weights + weights * self.opt_per_param / (
                bparts if self.shard_update else 1)
        return int(total)

    def activation_bytes(self, c: Candidate) -> int:
        cfg, b = self.cfg, self.batch / c.parts("batch") / self.accumulate
        heads = cfg.num_heads / c.parts("heads") * cfg.d_kv
        ff = cfg.d_ff / c.parts("d_ff")
        if cfg.moe:
            ff = max(ff, cfg.moe.train_capacity_factor * cfg.d_ff / c.parts("d_ff"))
        total = 0.0
        for s in self.stacks:
            t = b * s.length
            full = t * (4 * cfg.d_model + 4 * heads + 2 * cfg.num_heads / c.parts("heads")
                        * s.length + 2 * ff) * self.act_bytes
            saved = t * cfg.d_model * self.act_bytes if self.remat == "full" else full
            total += s.layers * saved + full
        logits = b * self.stacks[-1].length * cfg.vocab_size / c.parts("vocab") * 4 * 3
        return int(total + logits)

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

        for w in self.weights:
            own = {a for d in set(w.dims) if d in DIMS for a in c.axes(d)}
            parts = math.prod(c.parts(d) for d in set(w.dims) if d in DIMS and d != "batch")
            add("all-reduce", batch_axes - own, 4 * w.elements / parts, 1)
        act = self.passes - 1                  # forward (+ recompute) and backward
        seqs = self.batch / c.parts("batch")
        enc = self.stacks[0] if len(self.stacks) == 2 else None
        for s in self.stacks:
            tokens = seqs * s.length * cfg.d_model * self.act_bytes
            attentions = 2 if enc and s is not enc else 1
            add("all-reduce", c.axes("heads"), tokens, act * s.layers * attentions)
            add("all-reduce", c.axes("d_ff"), tokens, act * (s.layers - s.sparse_layers))
            if cfg.moe and s.sparse_layers:
                experts = set(c.axes("experts"))
                add("all-to-all", experts & batch_axes, tokens * s.computed,
                    2 * act * s.sparse_layers)                  # dispatch + combine
                add("all-reduce", c.axes("d_ff"), tokens * s.computed, act * s.sparse_layers)
                add("all-reduce", experts - batch_axes, tokens, act * s.sparse_layers)
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
                -sum(HOME[d] in a for d, a in c.rules))


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


def run_lengths(config, cfg) -> tuple[int, ...]:
    """Tokens per sequence per stack: span corruption's inputs and targets; else the run's
    length for each stack."""
    from switchzoo.data import span_corruption
    if config.task == "span_corruption":
        return (config.max_length, span_corruption.lengths(
            config.max_length, config.data.noise_density,
            config.data.mean_noise_span_length)[1])
    return (config.max_length,) * (2 if cfg.num_encoder_layers else 1)


def weights_of(cfg) -> tuple[list[Weight], dict]:
    """(the estimate's weights, the abstract parameters) of a model config."""
    import jax
    import numpy as np
    from switchzoo import state as state_lib
    _, params, dims = state_lib.abstract_model(cfg)
    out = []
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        name = state_lib.path_name(path)
        d = tuple(dims[name])
        out.append(Weight(name.split("/")[0], weight_role(name, d, cfg.tie_embeddings), d,
                          int(np.prod(x.shape))))
    return out, params


def analytic_model(config, cfg, optimizer, devices: int) -> Model:
    """The estimate's view of a run config on ``devices`` devices."""
    import jax
    weights, params = weights_of(cfg)
    opt = jax.eval_shape(optimizer.init, params)
    opt_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(opt)
                    if hasattr(x, "dtype"))
    param_bytes = sum(4 * w.elements for w in weights)
    batch = config.per_device_batch_size * devices
    accumulate = max(config.grad_accum_steps, 1)
    return Model(cfg, weights, stacks_of(cfg, run_lengths(config, cfg), batch // accumulate),
                 opt_bytes / param_bytes, bool(config.shard_optimizer_over_data), batch,
                 2 if cfg.dtype == "bfloat16" else 4, cfg.remat, accumulate)
