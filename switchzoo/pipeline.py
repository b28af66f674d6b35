"""Pipeline parallelism: a scanned stack's layers split over a mesh's stage axis
(``layers:stage`` in a layout string), micro-batches flowing through the stages.

GPipe (Huang et al. 2019) by default: stage s holds a contiguous block of the stack's layer
groups (the contiguous split GSPMD gives the 'layers' dim of the stacked parameters), the batch
is cut into M micro-batches, and in iteration t stage s runs micro-batch t - s. Everything runs
under the step's one jax.jit: the S stages are a jax.vmap over a stage-sharded leading axis
(``spmd_axis_name``, so each device computes its own stage) and the hand-over between
neighbouring stages is a jnp.roll of that axis, which GSPMD compiles to a collective-permute.
Autodiff of the loop gives the backward pipeline (in reverse), and each layer group keeps its
remat policy, so a stage holds one group input per micro-batch in flight.

With ``repeats`` R > 1 the schedule is circular (MaxText's num_pipeline_repeats; Narayanan et
al. 2021's interleaving): the layers are cut into R x S blocks, block r*S + s runs on stage s in
round r, and a micro-batch leaving the last stage re-enters the first for the next round.
Each device then holds R non-adjacent blocks and the bubble shrinks from (S-1)/(M+S-1) to
(S-1)/(RM+S-1). The stored parameters keep the model's own layer order (checkpoints are the
same tree whatever the mesh), so for R > 1 the step re-lays each stacked parameter into
round-major blocks: one all-to-all of the stack's parameters over the stage axis per step, and
of their gradients back.

An encoder-decoder pipelines each stack in turn over the same stages: the encoder's micro-batches
flow through, its output is reassembled and normed as in an unpipelined step, and in the
decoder's pipeline each micro-batch carries its encoder output along from stage to stage (every
decoder layer's cross-attention reads it): one more activation-sized send per hand-over.

Micro-batch m holds batch rows m, m + M, m + 2M, ... (strided, as gradient accumulation's), so
each has rows on every device that holds the batch and cutting the batch moves no data. Routing
groups are formed within a micro-batch: a Switch layer routes as the unpipelined step does
where moe.group_size divides the sequence length (or is 0: a group per sequence), and its
losses and metrics are combined over the micro-batches exactly (eq. 4 from the per-group sums,
means weighted by routed tokens); where groups span rows, they are other groups of the same
size.
Dropout draws its masks per micro-batch (and per batch shard), so with dropout the pipelined and
unpipelined steps are the same model with other masks, and the masks depend on the mesh.

Where the layout splits the batch over mesh axes, each stage runs per batch shard: jax.vmap
over the shards (``spmd_axis_name`` the batch's axes), each shard with its own copy of the
stage's weights, broadcast before the loop. Autodiff then sums the copies' gradients once, after
the loop: without the copies, GSPMD keeps the loop-invariant weights' gradient replicated over
the batch axes and all-reduces every iteration's contribution (19 all-reduces of the stage's
weights a step at 4 stages and 16 micro-batches, where one is needed). The experts' FFN
weights, where the layout splits the experts over batch axes (expert parallelism), are not
copied over those axes but cut: each shard of them holds its own E / n experts, and a Switch
layer sends each expert's capacity slots to its shard by all_to_all over the vmap axis SHARDS
(the layout inside says so: ``Layout.exchange``). Where the experts take only some of the
batch's axes (``dp_pp_ep``: batch over data and expert, experts over expert), those must be a
leading or trailing run of them: two nested vmaps, the major group outermost, one over the
experts' axes (SHARDS, cut) and one over the rest (COPIES, copied). Other weights split over
batch axes (FSDP) are gathered once before the loop. Where an expert FFN weight is split over
batch axes in another way (its experts over batch axes in another order or between others, or
over a batch axis and another; its d_model or d_ff over one), the stages run unsharded, with
the per-iteration all-reduce.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from switchzoo.layout import experts_cut, use
from switchzoo.moe import BALANCE_STATS
from switchzoo.routing import Balance, switch_aux_loss


@dataclasses.dataclass(frozen=True)
class Plan:
    axis: str               # the mesh axis the 'layers' dim is split over
    stages: int
    microbatches: int
    repeats: int

    @property
    def iterations(self) -> int:
        return self.repeats * self.microbatches + self.stages - 1

    @property
    def bubble(self) -> float:
        """The schedule's idle fraction of each stage: (S-1) / (RM + S-1)."""
        return (self.stages - 1) / self.iterations


SHARDS = "shards"       # the axis name of the per-shard vmap whose shards hold their own experts
COPIES = "copies"       # ... and of the one whose shards hold a copy of every weight


@dataclasses.dataclass(frozen=True)
class Group:
    """Batch axes one per-shard vmap runs over (its spmd_axis_name), major first."""
    axes: tuple[str, ...]
    count: int
    name: str               # SHARDS: the experts are cut over these axes; COPIES: copied


@dataclasses.dataclass(frozen=True)
class Shards:
    axes: tuple[str, ...]   # the mesh axes the batch is split over
    count: int
    cut: tuple[bool, ...]   # per stacked parameter: its experts cut over the SHARDS group
    groups: tuple[Group, ...]   # the batch's axes in order, one or two groups (one vmap each)

    @property
    def experts_over(self) -> tuple[str, ...]:
        return next((g.axes for g in self.groups if g.name == SHARDS), ())


def shards(layout, dims: list[tuple[str, ...]], microbatch_rows: int) -> Shards | None:
    """How each stage runs per batch shard (see the module doc), for stacked parameters of
    ``dims`` and micro-batches of ``microbatch_rows``; None where it runs unsharded: no batch
    axes, rows that do not split over them, or an expert FFN weight split over the batch's
    axes other than by its experts over a leading or trailing run of them
    (layout.experts_cut). Axes of size 1 count as unsplit."""
    size = layout.mesh.shape
    axes_of = lambda d: tuple(a for a in layout.axes(d) if size[a] > 1)  # noqa: E731
    axes = axes_of("batch")
    count = math.prod(size[a] for a in axes)
    if count == 1 or microbatch_rows % count:
        return None
    found = experts_cut(dims, axes_of)
    if found is None:
        return None
    cut, over = found
    n = len(over)
    runs = ([(axes, COPIES)] if not over else [(axes, SHARDS)] if over == axes
            else [(over, SHARDS), (axes[n:], COPIES)] if axes[:n] == over
            else [(axes[:-n], COPIES), (over, SHARDS)])
    groups = tuple(Group(a, math.prod(size[x] for x in a), name) for a, name in runs)
    return Shards(axes, count, tuple(cut), groups)


def stage_axis(layout) -> str | None:
    """The mesh axis a layout splits the 'layers' dim over (None: not pipelined)."""
    if layout is None or layout.parts("layers") == 1:
        return None
    axes = layout.rules.get("layers", ())
    if len(axes) != 1:
        raise ValueError(f"layout {layout.text!r} splits 'layers' over {'+'.join(axes)}; "
                         "pipeline over one mesh axis, e.g. 'layers:stage'")
    return axes[0]


def plan(layout, cfg) -> Plan | None:
    """The pipeline ``layout`` and ``cfg`` ask for, or None (no stage axis)."""
    axis = stage_axis(layout)
    if axis is None:
        return None
    stages = layout.mesh.shape[axis]
    return Plan(axis, stages, cfg.pipeline_microbatches or stages, cfg.pipeline_repeats)


def check(layout, cfg, stack_groups: dict[str, int], batch: int | None = None) -> Plan | None:
    """Refuses, in one line each, a pipeline the model or batch cannot run: layers not scanned,
    a stack whose layer groups do not divide into stages x repeats, a batch that does not divide
    into micro-batches, a circular schedule with fewer micro-batches than stages, an axis that
    other dims use too. ``stack_groups``: {stack name: its layer groups}. Without a stage axis
    the pipeline fields are not read (switchzoo.validate refuses them in a run config)."""
    p = plan(layout, cfg)
    if p is None:
        return None
    if not cfg.scan_layers:
        raise ValueError(f"the layout splits 'layers' over '{p.axis}' but the layers are not "
                         "scanned; set --config.scan_layers=true to pipeline")
    others = [d for d, axes in layout.rules.items() if d != "layers" and p.axis in axes]
    if others:
        raise ValueError(f"the layout splits both 'layers' and {others[0]!r} over "
                         f"'{p.axis}'; keep the stage axis for 'layers' alone")
    blocks = p.stages * p.repeats
    for name, groups in stack_groups.items():
        if groups % blocks:
            raise ValueError(f"the {name} has {groups} scanned layer groups, not divisible by "
                             f"{p.stages} stages x {p.repeats} repeats; choose stages x "
                             f"pipeline_repeats dividing {groups}")
    if p.repeats > 1 and p.microbatches < p.stages:
        raise ValueError(f"a circular pipeline (pipeline_repeats={p.repeats}) needs at least "
                         f"as many micro-batches as stages ({p.stages}); set "
                         f"--config.pipeline_microbatches >= {p.stages}")
    if batch is not None and batch % p.microbatches:
        raise ValueError(f"the batch of {batch} rows does not divide into "
                         f"{p.microbatches} pipeline micro-batches; choose "
                         "pipeline_microbatches dividing the global batch")
    if batch is not None and cfg.moe is not None:
        check_routing(layout, p, batch)
    return p


def check_routing(layout, p: Plan, batch: int) -> None:
    """Refuses micro-batches whose rows do not split over the batch's shards: the stages would
    run unsharded (``shards``), and a Switch layer would route other groups than the
    unpipelined step does (other losses and gradients, silently). Names the counts that fit."""
    size = layout.mesh.shape
    count = math.prod(size[a] for a in layout.axes("batch") if size[a] > 1)
    rows = batch // p.microbatches
    if count == 1 or rows % count == 0:
        return
    least = p.stages if p.repeats > 1 else 1
    fits = [m for m in range(least, batch + 1) if batch % m == 0 and (batch // m) % count == 0]
    below = [m for m in fits if m <= p.microbatches]
    hint = (f"use --config.pipeline_microbatches={below[-1] if below else fits[0]}"
            if fits else f"use a global batch that is a multiple of {count} x the micro-batches")
    raise ValueError(f"pipeline_microbatches={p.microbatches} gives micro-batches of {rows} "
                     f"rows, which do not split over the batch's {count} shards: the stages "
                     "would run unsharded and the Switch layers route other groups than the "
                     f"unpipelined step; {hint} (micro-batch rows a multiple of {count})")


def schedule(p: Plan) -> dict[str, np.ndarray]:
    """Per iteration t (static): each stage's micro-batch and round ([iterations, stages]), and
    the micro-batch stage 0 takes ([iterations])."""
    S, M, R = p.stages, p.microbatches, p.repeats
    t = np.arange(p.iterations)
    since = t[:, None] - np.arange(S)[None, :]         # micro-batch steps since stage s began
    return {"micro": since % M, "round": np.clip(since // M, 0, R - 1), "first": t % M}


def run(p: Plan, layout, body, x_BTD, rows, shared, params, keys):
    """``body(x, rows, shared, params, keys, select) -> (x, stats)`` runs consecutive layer
    groups (a lax.scan over ``params``' leading dim, the stats its ys: a list of {name: [groups,
    ...]}; ``select``, when given, picks each group's parameters from its slice, inside the
    group's remat; ``params``: nnx state, whose Variables name their dims); ``rows`` are per
    batch row, ``shared`` the same for every row. Runs all the groups over the stage axis;
    returns (x_BTD, stats) as one unpipelined ``body`` would."""
    S, M, R = p.stages, p.microbatches, p.repeats
    B = x_BTD.shape[0]
    if B % M:
        raise ValueError(f"the batch of {B} rows does not divide into {M} pipeline "
                         "micro-batches; choose pipeline_microbatches dividing it")
    mb = B // M
    dims = [v.get_metadata()["dims"] for v in jax.tree.leaves(
        params, is_leaf=lambda x: isinstance(x, nnx.Variable))]
    sh = shards(layout, dims, mb)

    def on_stage(a, dim=0):     # stage-sharded at ``dim``, the other dims left to GSPMD
        spec = [P.UNCONSTRAINED] * a.ndim
        spec[dim] = p.axis
        return jax.lax.with_sharding_constraint(a, NamedSharding(layout.mesh, P(*spec)))

    def on_shards(a):           # [S, group, (group,) ...]: each device its stage's and shard's
        spec = (p.axis, *(g.axes for g in sh.groups))
        spec += (P.UNCONSTRAINED,) * (a.ndim - len(spec))
        return jax.lax.with_sharding_constraint(a, NamedSharding(layout.mesh, P(*spec)))

    def per_shard(a, d, cut):   # [S, ...] -> [S, group, (group,) ...]: copies, or the experts
        e = d.index("experts") + 1 + (R > 1) if cut else None   # 'layers' became [S, groups
        for k, g in enumerate(sh.groups, start=1):              # / (S R) (, R)]
            if cut and g.name == SHARDS:     # the group's shards each hold E / count experts
                a = jnp.moveaxis(a.reshape(a.shape[:e] + (g.count, -1) + a.shape[e + 1:]), e, k)
            else:
                a = jnp.broadcast_to(jnp.expand_dims(a, k), a.shape[:k] + (g.count,) + a.shape[k:])
            e = None if e is None else e + 1
        return on_shards(a)

    def blocks(a):              # [groups, ...] -> [S, R, groups / (S R), ...]: block r S + s
        return jnp.swapaxes(on_stage(a.reshape((R, S, -1) + a.shape[1:]), 1), 0, 1)

    acts = lambda a: layout.constrain(a, (None, "batch", "length", "d_model"))
    # Micro-batch m holds rows m, m + M, ... (as steps.micro_batches): every micro-batch has
    # rows on every device holding the batch, so splitting and joining move no data.
    split = lambda a: jnp.swapaxes(a.reshape((mb, M) + a.shape[1:]), 0, 1)
    sched = schedule(p)
    # GPipe: stage s's groups [S, groups / S, ...]. Circular: [S, groups / (S R), R, ...], the
    # round picked inside each group's remat (a pick per iteration outside it would keep a copy
    # of the stage's parameters per iteration for the backward pass).
    by_round = (lambda a: a[:, 0]) if R == 1 else (lambda a: jnp.swapaxes(a, 1, 2))
    stage_params = jax.tree.map(lambda a: by_round(blocks(a)), params)
    stage_keys = None if keys is None else by_round(blocks(keys))
    # A copy per stage (and shard): its gradient (the relative-position bias's) adds up on each
    # and is summed over them once, after the loop, not in every iteration.
    stage_shared = jax.tree.map(lambda a: on_stage(jnp.broadcast_to(a, (S,) + a.shape)), shared)
    if sh is not None:
        leaves, tree = jax.tree.flatten(stage_params)
        stage_params = jax.tree.unflatten(tree, [per_shard(a, d, c) for a, d, c
                                                 in zip(leaves, dims, sh.cut)])
        stage_shared = jax.tree.map(lambda a: per_shard(a, (), False), stage_shared)
        inner = layout.within(sh.axes, SHARDS if any(sh.cut) else None)
    # What stage 0 takes in each iteration t: micro-batch t mod M, fresh while t < M (after
    # that, in a circular schedule, the last stage's output of M - S + 1 iterations before,
    # its next round; in GPipe, a bubble). Its rows (masks, encoder output) travel with it.
    fresh = jnp.asarray(np.arange(p.iterations) < M)
    entering = acts(jnp.where(fresh[:, None, None, None], split(x_BTD)[sched["first"]], 0))
    entering_rows = jax.tree.map(lambda a: split(a)[sched["first"]], rows)

    def stage(x, rows, shared, params, keys, micro, round_):
        pick = lambda a: jax.lax.dynamic_index_in_dim(a, round_, 1, keepdims=False)
        if R > 1:
            keys = None if keys is None else pick(keys)
        keys = None if keys is None else _fold(keys, micro)
        select = None if R == 1 else lambda p: jax.tree.map(
            lambda a: jax.lax.dynamic_index_in_dim(a, round_, 0, keepdims=False), p)
        if sh is None:
            return body(x, rows, shared, params, keys, select)

        def shard(x, rows, shared, params):
            index = 0                            # the shard's place in the batch, major first
            for g in sh.groups:
                index = index * g.count + jax.lax.axis_index(g.name)
            k = None if keys is None else _fold(keys, index)
            with use(inner):
                return body(x, rows, shared, params, k, select)
        for g in reversed(sh.groups):            # one vmap per group, the major outermost
            shard = jax.vmap(shard, axis_name=g.name, spmd_axis_name=g.axes)
        counts = tuple(g.count for g in sh.groups)
        by_shard = lambda a: a.reshape(counts + (-1,) + a.shape[1:])   # [groups.., rows, ...]
        x, stats = shard(by_shard(x), jax.tree.map(by_shard, rows), shared, params)
        flat = lambda a: a.reshape((sh.count,) + a.shape[len(counts):])  # noqa: E731
        return x.reshape((-1,) + x.shape[len(counts) + 1:]), jax.tree.map(flat, stats)

    def iteration(carry, xs):
        (x, x_rows), delay = carry
        new, new_rows, is_fresh, micro, round_ = xs
        if delay is not None:
            new = jnp.where(is_fresh, new, delay[0])
        enter = lambda a, b: on_stage(jnp.roll(a, 1, axis=0).at[0].set(b))
        x, x_rows = enter(x, new), jax.tree.map(enter, x_rows, new_rows)
        x, stats = jax.vmap(stage, spmd_axis_name=p.axis)(
            x, x_rows, stage_shared, stage_params, stage_keys, micro, round_)
        x = on_stage(x)
        # The last stage's output, on every stage: a masked sum over the stage axis (one
        # all-reduce), which GSPMD partitions better than a slice of one shard.
        last = acts(jnp.sum(jnp.where(jnp.arange(S)[:, None, None, None] == S - 1, x, 0),
                            axis=0)[None])
        if delay is not None:
            delay = jnp.concatenate([delay[1:], last])
        return ((x, x_rows), delay), (last[0], stats)

    per_stage = lambda a: on_stage(jnp.zeros((S,) + a.shape[1:], a.dtype))
    state = (per_stage(entering), jax.tree.map(per_stage, entering_rows))
    delay = None if R == 1 else acts(jnp.zeros((M - S + 1,) + entering.shape[1:], x_BTD.dtype))
    xs = (entering, entering_rows, fresh, jnp.asarray(sched["micro"]),
          jnp.asarray(sched["round"]))
    _, (leaving, stats) = jax.lax.scan(iteration, (state, delay), xs)
    # The last M iterations finish micro-batches 0 .. M-1 of the last round.
    return (jnp.swapaxes(leaving[-M:], 0, 1).reshape(x_BTD.shape),
            combine(stats, p, 1 if sh is None else sh.count))


def _fold(keys, m):
    """Each key of ``keys`` (typed, or raw uint32 [..., 2]) folded with micro-batch ``m``."""
    typed = jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key)
    flat = keys.reshape((-1,) if typed else (-1, keys.shape[-1]))
    return jax.vmap(jax.random.fold_in, (0, None))(flat, m).reshape(keys.shape)


def combine(stats: list[dict], p: Plan, shard_count: int = 1) -> list[dict]:
    """Per-iteration stats [iterations, S, (shards,) groups / (S R), ...] -> per layer group
    [groups, ...], over the micro-batches (and their shards, each as one more micro-batch):
    routed tokens added, per-routing-group balance sums joined (micro-batch by micro-batch),
    eq. 4 recomputed from them, every other statistic (a mean over routed tokens) weighted by
    its micro-batch's tokens."""
    S, M, R = p.stages, p.microbatches, p.repeats
    r, s, m = np.meshgrid(np.arange(R), np.arange(S), np.arange(M), indexing="ij")
    ran = r * M + m + s                       # the iteration stage s ran round r of batch m
    out = []
    for layer in stats:
        v = {k: x[ran, s] for k, x in layer.items()}           # [R, S, M, per block, ...]
        if shard_count > 1:                                     # [R, S, M, shards, ...]
            v = {k: x.reshape(x.shape[:2] + (-1,) + x.shape[4:]) for k, x in v.items()}
        routed = v["routed_tokens"]
        weight = routed / jnp.maximum(jnp.sum(routed, axis=2, keepdims=True), 1.0)
        joined = {}
        for k, x in v.items():
            if k == "routed_tokens":
                joined[k] = jnp.sum(x, axis=2)
            elif k in BALANCE_STATS:          # [R, S, M, block, g, ...] -> [R, S, block, M g, ...]
                x = jnp.moveaxis(x, 2, 3)
                joined[k] = x.reshape(x.shape[:3] + (-1,) + x.shape[5:])
            elif k != "aux_loss":
                w = weight.reshape(weight.shape + (1,) * (x.ndim - weight.ndim))
                joined[k] = jnp.sum(x * w, axis=2)
        # [R, S, block, ...] -> [groups, ...]: group (r S + s) block + i, the model's order
        joined = {k: x.reshape((-1,) + x.shape[3:]) for k, x in joined.items()}
        joined["aux_loss"] = jax.vmap(switch_aux_loss)(
            Balance(*(joined[k] for k in BALANCE_STATS)))
        out.append(joined)
    return out
