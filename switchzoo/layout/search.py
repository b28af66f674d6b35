"""Layout search: the mesh and layout for a run on N devices, chosen from the compiled program
under a stated cost model.

    python -m switchzoo.layout search --model switch_base_128 --devices 32 --hardware tpu_v3
    python train.py --config=configs/c4.py --search_layout --devices 32 --hardware tpu_v3

1. Enumerate. Meshes: every ordered factorisation of N over the axes (data, model, expert by
   default; ``--fix model:8`` pins one). Layouts: each of batch, heads, d_ff, vocab and experts
   goes to one axis, to several (``a+b``) or nowhere. Axes of size 1 are dropped, so a layout is
   counted once, and two candidates that differ only in axis names are one.
2. Prune, saying how many and why: a dimension its axes do not divide; one tensor split twice
   over one axis (batch with heads / d_ff / vocab; experts with d_ff); a mesh axis that nothing
   splits (its devices repeat the work of the others: dominated); a state (parameters,
   gradients, optimizer state, exact per device from the shardings) over the budget.
3. Estimate the rest analytically (per-device activations under the remat policy; compute from
   the model's FLOPs; gradient all-reduces, model-parallel all-reduces and expert all-to-alls
   from their sizes) and compile the ``--top`` most promising with the run's real train step from
   abstract state (switchzoo.dry_run.compile_step; nothing is allocated). Each compile is cached
   on disk (``--cache``).
4. Rank what compiled by the cost model of switchzoo/layout/hardware.py over the compiled
   program (switchzoo/layout/hlo.py: matmul FLOPs and every collective with its bytes and mesh
   axes) and XLA's per-device peak memory; print the table and the winner as flags.

Numbers are XLA:CPU's for the per-device program on simulated devices (the dry run's):
fusion and so temporaries differ on TPU/GPU; the step time is a model, not a measurement.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import pathlib
import time

from switchzoo.layout import hardware, hlo
from switchzoo.layout.candidates import (  # noqa: F401  (the search's vocabulary)
    DIMS, HOME, MODEL_DIMS, Candidate, Sizes, enumerate_candidates, factorisations)
from switchzoo.layout import LayoutError, DEFAULT_AXES, _NAME

GIB = 2 ** 30


# ------------------------------------------------------------------------- the analytic model

@dataclasses.dataclass
class Model:
    """What the analytic estimate needs of the run, computed once."""
    cfg: object
    tensors: list            # (dims, elements) of every parameter
    opt_per_param: float     # optimizer-state bytes per parameter byte (from the real optimizer)
    shard_update: bool       # optimizer state also split over the batch axes
    batch: int               # global sequences
    lengths: tuple[int, ...] # tokens per sequence per stack (decoder-only: one stack)
    act_bytes: int
    remat: str
    train_flops: float       # per step, forward + backward (+ recompute), all devices
    model_flops: float       # per step, forward + backward: what MFU counts
    accumulate: int = 1      # micro-batches per step: activations of one micro-batch live

    def state_bytes(self, c: Candidate) -> int:
        """Parameters + gradients (+ their sum over micro-batches) + optimizer state per device
        (float32), from the layout."""
        total = 0.0
        bparts = c.parts("batch")
        for dims, elements in self.tensors:
            parts = math.prod(c.parts(d) for d in set(dims) if d in DIMS and d != "batch")
            weights = 4 * elements / parts
            grads = 2 if self.accumulate > 1 else 1       # + the accumulated sum
            total += (1 + grads) * weights + weights * self.opt_per_param / (
                bparts if self.shard_update else 1)
        return int(total)

    def activation_bytes(self, c: Candidate) -> int:
        cfg, b = self.cfg, self.batch / c.parts("batch") / self.accumulate
        heads = cfg.num_heads / c.parts("heads") * cfg.d_kv
        ff = cfg.d_ff / c.parts("d_ff")
        if cfg.moe:
            ff = max(ff, cfg.moe.train_capacity_factor * cfg.d_ff / c.parts("d_ff"))
        layers = ([cfg.num_encoder_layers, cfg.num_layers] if len(self.lengths) == 2
                  else [cfg.num_layers])
        total = 0.0
        for n, length in zip(layers, self.lengths):
            t = b * length
            full = t * (4 * cfg.d_model + 4 * heads + 2 * cfg.num_heads / c.parts("heads")
                        * length + 2 * ff) * self.act_bytes
            saved = t * cfg.d_model * self.act_bytes if self.remat == "full" else full
            total += n * saved + full
        logits = b * self.lengths[-1] * cfg.vocab_size / c.parts("vocab") * 4 * 3
        return int(total + logits)

    def step_seconds(self, c: Candidate, profile: hardware.Profile) -> float:
        """Compute + the collectives the layout implies, by their sizes (ring costs)."""
        sizes, cfg = dict(c.mesh), self.cfg
        batch_axes = set(c.axes("batch"))
        tokens = self.batch / c.parts("batch") * sum(self.lengths)
        passes = 4 if self.remat == "full" else 3
        # compute: each weight's matmuls, split over the batch and over the weight's own axes
        flops = 0.0
        for dims, elements in self.tensors:
            if len(dims) < 2 or "relpos_buckets" in dims:
                continue
            own = {a for d in set(dims) if d in DIMS for a in c.axes(d)} - batch_axes
            share = (cfg.moe.top_k / cfg.moe.num_experts
                     if cfg.moe and "experts" in dims else 1.0)
            flops += 2 * elements * share * tokens / math.prod(sizes[a] for a in own)
        seconds = passes * flops / profile.peak_flops
        bw = profile.ici_bytes_per_s
        # gradients: each parameter's shard is summed over the batch axes it is not split on
        for dims, elements in self.tensors:
            own = {a for d in set(dims) if d in DIMS for a in c.axes(d)}
            n = math.prod(sizes[a] for a in batch_axes - own)
            parts = math.prod(c.parts(d) for d in set(dims) if d in DIMS and d != "batch")
            seconds += 2 * (n - 1) / n * 4 * elements / parts / bw
        act = passes - 1                     # forward (+ recompute) and backward
        layers = cfg.num_layers + cfg.num_encoder_layers
        m = math.prod(sizes[a] for a in set(c.axes("heads")) | set(c.axes("d_ff")))
        ring = lambda n: 2 * (n - 1) / n      # noqa: E731
        seconds += act * 2 * layers * ring(m) * tokens * cfg.d_model * self.act_bytes / bw
        if cfg.moe:
            sparse = layers / max(cfg.moe.sparse_every, 1)
            moved = tokens * cfg.moe.train_capacity_factor * cfg.d_model * self.act_bytes
            e = math.prod(sizes[a] for a in set(c.axes("experts")) & batch_axes)
            r = math.prod(sizes[a] for a in set(c.axes("experts")) - batch_axes)
            seconds += act * 2 * sparse * (e - 1) / e * moved / bw      # dispatch + combine
            seconds += act * sparse * ring(r) * tokens * cfg.d_model * self.act_bytes / bw
        return seconds

    def simplicity(self, c: Candidate) -> tuple:
        """Tie-break: fewer split dimensions, then more on their usual axes."""
        return (sum(len(a) for _, a in c.rules),
                -sum(HOME[d] in a for d, a in c.rules))


def analytic_model(config, cfg, optimizer) -> Model:
    import jax
    import numpy as np
    from switchzoo import state as state_lib, zoo
    from switchzoo.data import span_corruption
    _, params, dims = state_lib.abstract_model(cfg)
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    tensors = [(tuple(dims[state_lib.path_name(p)]), int(np.prod(x.shape))) for p, x in flat]
    param_bytes = sum(4 * e for _, e in tensors)
    opt = jax.eval_shape(optimizer.init, params)
    opt_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(opt)
                    if hasattr(x, "dtype"))
    if config.task == "span_corruption":
        lengths = (config.max_length, span_corruption.lengths(
            config.max_length, config.data.noise_density,
            config.data.mean_noise_span_length)[1])
    else:
        lengths = (config.max_length,) * (2 if cfg.num_encoder_layers else 1)
    batch = config.per_device_batch_size * jax.device_count()
    per_token = zoo.flops_per_token(cfg, max(lengths))
    passes = 4 if cfg.remat == "full" else 3
    return Model(cfg, tensors, opt_bytes / param_bytes, bool(config.shard_optimizer_over_data),
                 batch, lengths, 2 if cfg.dtype == "bfloat16" else 4, cfg.remat,
                 passes * per_token * batch * lengths[-1], 3 * per_token * batch * lengths[-1],
                 max(config.grad_accum_steps, 1))


# --------------------------------------------------------------------------------- compiling

def cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("SWITCHZOO_CACHE",
                                       pathlib.Path.home() / ".cache" / "switchzoo")) / "layouts"


@functools.cache
def code_version() -> str:
    """sha1 of switchzoo's source: a cached compile is stale once the code changes (all of it
    but the search, its candidates, its command line and the cost model, which read the cached
    numbers afresh)."""
    root = pathlib.Path(__file__).resolve().parents[1]
    h = hashlib.sha1()
    here = pathlib.Path(__file__).resolve().parent
    skip = {here / f for f in ("search.py", "hardware.py", "candidates.py", "command.py")}
    for path in sorted(p for p in root.rglob("*.py") if p.resolve() not in skip):
        h.update(path.relative_to(root).as_posix().encode() + path.read_bytes())
    return h.hexdigest()


def measure(config, cand: Candidate, profile: hardware.Profile, cache: bool = True) -> dict:
    """Compiles the run's train step for one candidate (or reads the cached result): XLA's
    memory per device, and the program read by hlo.read."""
    import jax
    from switchzoo import dry_run, inspector
    config = config.copy_and_resolve_references()
    config.mesh, config.layout = cand.mesh_text, cand.layout_text
    key = hashlib.sha1(json.dumps([config.to_json_best_effort(sort_keys=True), jax.__version__,
                                   code_version(), profile.devices_per_host]).encode()).hexdigest()
    path = cache_dir() / f"{key}.json"
    if cache and path.is_file():
        return {**json.loads(path.read_text()), "cached": True}
    compiled, setup, _, seconds = dry_run.compile_step(config)
    program = hlo.read(compiled.as_text(), {k: int(v) for k, v in setup.layout.mesh.shape.items()},
                       profile.devices_per_host)
    out = {"memory": inspector.memory_stats(compiled), "compile_seconds": round(seconds, 1),
           "flops": program.flops,
           "collectives": [dataclasses.asdict(c) for c in program.collectives]}
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(out))
        tmp.replace(path)
    return {**out, "cached": False}


def program_of(measured: dict) -> hlo.Program:
    return hlo.Program([hlo.Collective(**{**c, "axes": tuple(c["axes"])})
                        for c in measured["collectives"]], measured["flops"])


# ------------------------------------------------------------------------------------ search

def _run_cfg(config):
    from switchzoo import dry_run, state as state_lib, weights
    origin = weights.resolve(config.init_from).cfg if config.init_from else None
    return state_lib.run_model_config(config, dry_run.vocab_size(config), origin)


def parse_include(text: str, axes: tuple[str, ...], n: int) -> Candidate:
    """``data:4,model:1,expert:8/batch:data+expert,experts:expert`` -> a Candidate."""
    from switchzoo import layout as layout_lib
    mesh_text, sep, layout_text = text.partition("/")
    if not sep:
        raise LayoutError(f"--include {text!r}: write MESH/LAYOUT, e.g. "
                          "data:4,model:1,expert:8/batch:data+expert,experts:expert")
    spec = layout_lib.parse_mesh(mesh_text, n)
    rules = layout_lib.parse_layout(layout_lib.layout_string(layout_text), spec.axes)
    return Candidate(tuple(zip(spec.axes, spec.shape)),
                     tuple((d, rules.get(d, ())) for d in DIMS)
                     + tuple((d, a) for d, a in rules.items() if d not in DIMS))


def search(config, profile: hardware.Profile, budget_bytes: float,
           axes: tuple[str, ...] = DEFAULT_AXES, fixed: dict[str, int] | None = None,
           top: int = 6, cache: bool = True, print_fn=print, include=()) -> dict:
    """Runs in a process with the N devices to search over (simulated CPU devices).
    ``include``: MESH/LAYOUT texts compiled and ranked beside the search's (a paper's choice,
    or a preset), marked in the table."""
    import jax
    from switchzoo import state as state_lib
    n = jax.device_count()
    cfg = _run_cfg(config)
    optimizer = state_lib.run_optimizer(config)
    model = analytic_model(config, cfg, optimizer)
    sizes = Sizes(model.batch // model.accumulate, cfg.num_heads, cfg.d_ff, cfg.vocab_size,
                  cfg.moe.num_experts if cfg.moe else 0)
    start = time.perf_counter()
    cands, pruned = enumerate_candidates(n, axes, sizes, fixed,
                                         ordered=not profile.ici_spans_hosts)
    if not cands:
        raise LayoutError(
            f"no mesh of {n} devices over {','.join(axes)} divides the run's dimensions "
            f"(batch {sizes.batch} sequences, heads {sizes.heads}, d_ff {sizes.d_ff}, vocab "
            f"{sizes.vocab}{f', experts {sizes.experts}' if sizes.experts else ''}); choose a "
            f"device count that divides them (e.g. {_nearest_count(n, sizes)})")
    estimates = []
    for c in cands:
        state = model.state_bytes(c)
        if state > budget_bytes:
            pruned["state over the budget"] = pruned.get("state over the budget", 0) + 1
            continue
        estimates.append((c, state, state + model.activation_bytes(c),
                          model.step_seconds(c, profile)))
    if not estimates:
        raise LayoutError(_over_budget(model, cands, budget_bytes, n, profile))
    fitting = sorted((e for e in estimates if e[2] <= budget_bytes),
                     key=lambda e: (round(e[3], 6), model.simplicity(e[0])))
    rest = sorted((e for e in estimates if e[2] > budget_bytes), key=lambda e: e[2])
    chosen = (fitting + rest)[:top]
    extra = [parse_include(t, axes, n) for t in include]
    for text, c in zip(include, extra):
        bad = [d for d in DIMS if (d != "experts" or sizes.experts) and sizes.of(d) % c.parts(d)]
        if bad:
            raise LayoutError(f"--include {text}: {bad[0]} ({sizes.of(bad[0])}) is not divisible "
                              f"by its mesh axes ({c.parts(bad[0])} devices); change the mesh "
                              "or drop it from the layout")
    chosen_keys = {e[0].key(not profile.ici_spans_hosts) for e in chosen}
    for c in extra:
        if c.key(not profile.ici_spans_hosts) not in chosen_keys:
            chosen.append((c, model.state_bytes(c), model.state_bytes(c) +
                           model.activation_bytes(c), model.step_seconds(c, profile)))
    included = {c.key(not profile.ici_spans_hosts) for c in extra}
    enumerated = time.perf_counter() - start
    print_fn(f"layout search: {config.model} on {n} devices ({profile.name}), budget "
             f"{budget_bytes / GIB:.1f} GiB per device, batch {model.batch} x "
             f"{'+'.join(map(str, model.lengths))} tokens, {cfg.dtype}, remat {cfg.remat}, "
             f"{config.optimizer}")
    print_fn(f"enumerated {len(estimates) + sum(pruned.values())} candidates in {enumerated:.1f} s: "
             + ", ".join(f"{v} pruned ({k})" for k, v in pruned.items() if v)
             + f"; {len(estimates)} left, {len(fitting)} fit by the estimate; compiling "
               f"{len(chosen)}")
    rows = []
    for c, state, estimate, analytic in chosen:
        m = measure(config, c, profile, cache)
        program = program_of(m)
        cost = hardware.step_cost(program, profile)
        peak = m["memory"].get("peak_estimate_bytes")
        useful = model.model_flops / n
        rows.append({
            "mesh": c.mesh_text, "layout": c.layout_text,
            "included": c.key(not profile.ici_spans_hosts) in included,
            "peak_bytes": peak, "fits": peak is not None and peak <= budget_bytes,
            "estimated_peak_bytes": estimate, "state_bytes": state,
            "flops": program.flops, "bytes": program.bytes_by_kind(),
            "counts": program.counts(),
            "compute_ms": 1e3 * cost.compute_s, "communication_ms": 1e3 * cost.communication_s,
            "communication_ms_by_kind": {k: 1e3 * v for k, v in cost.by_kind_s.items()},
            "step_ms": 1e3 * cost.step_s, "analytic_step_ms": 1e3 * analytic,
            "mfu": useful / (cost.step_s * profile.peak_flops) if cost.step_s else None,
            "compile_seconds": m["compile_seconds"], "cached": m["cached"]})
        print_fn(f"  compiled {c.mesh_text} {c.layout_text}: peak "
                 f"{(peak or 0) / GIB:.2f} GiB, step {rows[-1]['step_ms']:.1f} ms"
                 + (" (cached)" if m["cached"] else f" (compiled in {m['compile_seconds']} s)"))
    rows.sort(key=lambda r: (not r["fits"], r["step_ms"] if r["fits"] else r["peak_bytes"] or 0))
    advice = None
    if rows and not rows[0]["fits"]:
        low = rows[0]
        advice = nearest_feasible(model, low, budget_bytes, n)
    result = {"model": config.model, "devices": n, "hardware": profile.key,
              "budget_bytes": budget_bytes, "batch": model.batch, "lengths": model.lengths,
              "dtype": cfg.dtype, "remat": cfg.remat, "optimizer": config.optimizer,
              "enumerated": len(estimates) + sum(pruned.values()), "pruned": pruned,
              "estimated": len(estimates), "compiled": len(rows), "rows": rows,
              "winner": rows[0] if rows and rows[0]["fits"] else None, "advice": advice,
              "seconds": round(time.perf_counter() - start, 1)}
    print_fn(format_table(result))
    return result


def nearest_feasible(model: Model, row: dict, budget: float, n: int) -> str:
    """What would bring the lowest compiled peak under the budget, each change with its
    estimated peak: the compiled peak minus the activations the change saves (analytic)."""
    cand = Candidate(tuple((a, int(s)) for a, s in (e.split(":") for e in row["mesh"].split(","))),
                     tuple((d, tuple(a.split("+"))) for d, a in
                           (e.split(":") for e in row["layout"].split(",") if e)))
    acts = model.activation_bytes(cand)
    peak = row["peak_bytes"]
    gib = lambda b: f"{b / GIB:.1f} GiB"    # noqa: E731
    options = []
    best = None
    summed = dataclasses.replace(model, accumulate=max(model.accumulate, 2))
    extra = summed.state_bytes(cand) - model.state_bytes(cand)   # the gradients' running sum
    for k in (2, 4, 8, 16, 32, 64):
        if model.batch % (model.accumulate * k * cand.parts("batch")) or \
                summed.state_bytes(cand) > budget:
            break
        less = acts - dataclasses.replace(model, accumulate=model.accumulate * k) \
            .activation_bytes(cand)
        best = f"--grad-accum {model.accumulate * k} (~{gib(peak - less + extra)})"
        if peak - less + extra <= budget:
            break
    if best:
        options.append(best)
    if model.remat != "full":
        less = acts - dataclasses.replace(model, remat="full").activation_bytes(cand)
        options.append(f"--remat full (~{gib(peak - less)})")
    if model.act_bytes == 4:
        less = acts - dataclasses.replace(model, act_bytes=2).activation_bytes(cand)
        options.append(f"--dtype bfloat16 (~{gib(peak - less)})")
    if not model.shard_update:
        saved = model.state_bytes(cand) - dataclasses.replace(
            model, shard_update=True).state_bytes(cand)
        options.append(f"weight-update sharding, --config.shard_optimizer_over_data=true "
                       f"(~{gib(peak - saved)})")
    options.append(f"{2 * n} devices (~{gib(peak / 2)} if state and activations halve)")
    return (f"the lowest peak is {gib(peak)} ({row['mesh']} {row['layout']}); nearest "
            f"feasible: " + "; ".join(options))


def _nearest_count(n: int, sizes: Sizes) -> int:
    for m in sorted(range(1, 4 * n + 1), key=lambda m: (abs(m - n), -m)):
        if m != n and sizes.batch % m == 0:
            return m
    return 1


def _over_budget(model: Model, cands, budget: float, n: int, profile) -> str:
    """One line: no layout's state fits; the nearest feasible changes, each with its estimate."""
    best = min(cands, key=model.state_bytes)
    gib = lambda b: f"{b / GIB:.1f} GiB"    # noqa: E731
    state = model.state_bytes(best)
    options = [f"{2 * n}+ devices (state ~{gib(state / 2)} on 2x the devices)"]
    if not model.shard_update:
        sharded = dataclasses.replace(model, shard_update=True).state_bytes(best)
        options.append(f"--config.shard_optimizer_over_data=true (weight-update sharding: "
                       f"~{gib(sharded)})")
    if model.remat != "full":
        options.append(f"--config.remat=full (activations ~"
                       f"{gib(dataclasses.replace(model, remat='full').activation_bytes(best))})")
    if model.act_bytes == 4:
        options.append(f"--config.dtype=bfloat16 (activations ~"
                       f"{gib(dataclasses.replace(model, act_bytes=2).activation_bytes(best))})")
    return (f"no layout on {n} devices fits {gib(budget)} per device: the smallest state "
            f"(parameters, gradients, optimizer) is {gib(state)} ({best.mesh_text} "
            f"{best.layout_text}); nearest feasible: " + "; ".join(options))


def format_table(result: dict) -> str:
    head = ("#", "mesh", "layout", "peak GiB", "fits", "TFLOP/dev", "AR MiB", "AG MiB",
            "RS MiB", "A2A MiB", "CP MiB", "compute ms", "comm ms", "step ms", "MFU")
    lines = [head]
    for i, r in enumerate(result["rows"], 1):
        b = r["bytes"]
        lines.append((f"{i}{'*' if r.get('included') else ''}", r["mesh"], r["layout"], f"{(r['peak_bytes'] or 0) / GIB:.2f}",
                      "yes" if r["fits"] else "no", f"{r['flops'] / 1e12:.2f}",
                      *(f"{b[k] / 2 ** 20:.0f}" for k in hlo.KINDS),
                      f"{r['compute_ms']:.1f}", f"{r['communication_ms']:.1f}",
                      f"{r['step_ms']:.1f}", f"{100 * r['mfu']:.0f}%" if r["mfu"] else "-"))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) if j in (1, 2, 4) else c.rjust(w)
                     for j, (c, w) in enumerate(zip(row, widths))) for row in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    if any(r.get("included") for r in result["rows"]):
        out.append("* asked for with --include (compiled beside the search's own candidates)")
    w = result["winner"]
    out.append(f"winner: --config.mesh={w['mesh']} --config.layout={w['layout']}" if w else
               f"no compiled candidate fits the budget; {result.get('advice') or ''}")
    return "\n".join(out)


def write_preset(name: str, result: dict, folder: pathlib.Path | None = None) -> pathlib.Path:
    """layouts/NAME.toml from the winner; refuses to overwrite a preset."""
    import importlib.resources
    from switchzoo import layout as layout_lib
    if not _NAME.match(name):
        raise LayoutError(f"--write {name!r}: a preset name is letters, digits and '_'")
    if result["winner"] is None:
        raise LayoutError("--write: no candidate fits the budget, so there is nothing to save")
    folder = folder or pathlib.Path(str(importlib.resources.files(layout_lib.PRESETS)))
    path = folder / f"{name}.toml"
    if path.exists():
        raise LayoutError(f"--write {name}: {path} exists; choose another name (nothing written)")
    w = result["winner"]
    doc = (f"layout search: {result['model']} on {result['devices']} x {result['hardware']}, "
           f"{result['budget_bytes'] / GIB:.0f} GiB per device; estimated step {w['step_ms']:.1f}"
           f" ms, peak {w['peak_bytes'] / GIB:.2f} GiB")
    path.write_text(f"doc = {json.dumps(doc)}\nmesh = {json.dumps(w['mesh'])}\n"
                    f"layout = {json.dumps(w['layout'])}\n")
    layout_lib.presets.cache_clear()
    return path
