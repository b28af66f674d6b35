"""Layout search: the mesh and layout for a run on N devices, chosen from the compiled program
under a stated cost model.

    python -m switchzoo.layout search --model switch_base_128 --devices 32 --hardware tpu_v3
    python train.py --config=configs/c4.py --search_layout --devices 32 --hardware tpu_v3

1. Enumerate. Meshes: every ordered factorisation of N over the axes (data, model, expert by
   default; ``--fix model:8`` pins one). Layouts: each of batch, heads, d_ff, vocab and experts
   goes to one axis, to several (``a+b``) or nowhere. Axes of size 1 are dropped, so a layout is
   counted once, and two candidates that differ only in axis names are one. A ``stage`` axis
   (``--axes stage,data,model,expert``) pipelines the scanned layers (``layers:stage``, nothing
   else on it; its size divides each stack's layer groups), with ``--microbatches`` (default 4 x
   stages, fewer where the batch does not allow it) and ``--repeats`` (default 1: GPipe).
2. Prune, saying how many and why: a dimension its axes do not divide; one tensor split twice
   over one axis (batch with heads / d_ff / vocab; experts with d_ff); a mesh axis that nothing
   splits (its devices repeat the work of the others: dominated); a state (parameters,
   gradients, optimizer state per device from the shardings) over the budget.
3. Estimate the rest (switchzoo/planner/estimate.py: activations under the remat policy; matmul
   FLOPs with each stack at its own length and the experts' capacity slots; the collectives the
   layout implies, priced like a compiled program's, hosts included) and compile the ``--top``
   most promising with the run's real train step from abstract state
   (switchzoo.dry_run.compile_step; nothing is allocated). Each compile is cached on disk.
4. Rank what compiled by the cost model of switchzoo/planner/hardware.py over the compiled
   program (switchzoo/planner/hlo.py: matmul FLOPs and every collective with its bytes and mesh
   axes) and XLA's per-device peak memory; print the table and the winner as flags.

Numbers are XLA:CPU's for the per-device program on simulated devices (the dry run's):
fusion and so temporaries differ on TPU/GPU; the step time is an estimate, not a measurement.
When nothing fits, switchzoo/planner/advice.py says what would, in the command's own flags.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import pathlib
import time

from switchzoo import atomic
from switchzoo import cache as cache_lib
from switchzoo.layout import DEFAULT_AXES, NAME, LayoutError
from switchzoo.planner import advice, hardware, hlo
from switchzoo.planner.candidates import (  # noqa: F401  (the search's vocabulary)
    DIMS, HOME, MODEL_DIMS, STAGE, Candidate, Sizes, enumerate_candidates, factorisations,
    microbatches_for)
from switchzoo.planner.from_config import analytic_model

GIB = 2 ** 30


# --------------------------------------------------------------------------------- compiling

def cache_dir() -> pathlib.Path | None:
    """The compiles' folder (switchzoo.cache); None: $SWITCHZOO_CACHE is empty, keep none."""
    return cache_lib.folder("layouts")


@functools.cache
def code_version() -> str:
    """sha1 of switchzoo's source: a cached compile is stale once the code changes (all of it
    but the search, its candidates, its command line and the cost model, which read the cached
    numbers afresh)."""
    root = pathlib.Path(__file__).resolve().parents[1]
    h = hashlib.sha1()
    here = pathlib.Path(__file__).resolve().parent
    skip = {here / f for f in ("search.py", "hardware.py", "candidates.py", "command.py",
                               "estimate.py", "advice.py")}
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
    pipelined = cand.stages > 1            # switchzoo/pipeline.py: scanned layers, M, R
    if pipelined:
        config.scan_layers = True
    config.pipeline_microbatches = cand.microbatches if pipelined else 0
    config.pipeline_repeats = cand.repeats if pipelined else 1
    key = hashlib.sha1(json.dumps([config.to_json_best_effort(sort_keys=True), jax.__version__,
                                   code_version(), profile.devices_per_host]).encode()).hexdigest()
    folder = cache_dir()
    cache = cache and folder is not None
    path = folder / f"{key}.json" if cache else None
    if cache and path.is_file():
        return {**json.loads(path.read_text()), "cached": True}
    compiled, setup, _, seconds = dry_run.compile_step(config)
    program = hlo.read(compiled.as_text(), {k: int(v) for k, v in setup.layout.mesh.shape.items()},
                       profile.devices_per_host)
    out = {"memory": inspector.memory_stats(compiled), "compile_seconds": round(seconds, 1),
           "flops": program.flops,
           "collectives": [dataclasses.asdict(c) for c in program.collectives]}
    if cache:
        with atomic.replacing(path) as f:
            f.write(json.dumps(out))
    return {**out, "cached": False}


def program_of(measured: dict) -> hlo.Program:
    return hlo.Program([hlo.Collective(**{**c, "axes": tuple(c["axes"])})
                        for c in measured["collectives"]], measured["flops"])


# ------------------------------------------------------------------------------------ search

def run_model(config):
    """The run's model config (the catalogue's, or the one ``init_from`` names)."""
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


def state_fits(state_bytes: float, budget_bytes: float) -> bool:
    """The pruning check: a candidate whose state alone is over the budget cannot fit."""
    return state_bytes <= budget_bytes


def estimate_candidates(model, cands, profile: hardware.Profile, budget_bytes: float,
                        pruned: dict | None = None) -> tuple[list, list]:
    """Step 3's estimate of each candidate whose state fits (the others counted in ``pruned``):
    (fitting, rest), lists of (candidate, state, estimated peak, estimated step seconds), those
    estimated to fit by step time (then simplicity), the rest by estimated peak."""
    estimates = []
    for c, state in zip(cands, map(model.state_bytes, cands)):
        if not state_fits(state, budget_bytes):
            if pruned is not None:
                pruned["state over the budget"] = pruned.get("state over the budget", 0) + 1
            continue
        estimates.append((c, state, state + model.activation_bytes(c),
                          model.step_seconds(c, profile)))
    fitting = sorted((e for e in estimates if e[2] <= budget_bytes),
                     key=lambda e: (round(e[3], 6), model.simplicity(e[0])))
    rest = sorted((e for e in estimates if e[2] > budget_bytes), key=lambda e: e[2])
    return fitting, rest


def search(config, profile: hardware.Profile, budget_bytes: float,
           axes: tuple[str, ...] = DEFAULT_AXES, fixed: dict[str, int] | None = None,
           top: int = 6, cache: bool = True, print_fn=print, include=(),
           spelling: str = "search", microbatches: int | None = None,
           repeats: int | None = None) -> dict:
    """Runs in a process with the N devices to search over (simulated CPU devices).
    ``include``: MESH/LAYOUT texts compiled and ranked beside the search's (a paper's choice,
    or a preset), marked in the table. ``spelling``: the flags the advice is written in
    ("search": this command's; "train": train.py's). ``microbatches`` and ``repeats``: a
    pipelined candidate's (None: the config's pipeline_microbatches and pipeline_repeats)."""
    import jax
    from switchzoo import state as state_lib
    n = jax.device_count()
    cfg = run_model(config)
    if STAGE in axes and not cfg.scan_layers:
        raise LayoutError(f"the '{STAGE}' axis pipelines scanned layers, and the run unrolls "
                          "them; drop --no-scan (or --config.scan_layers=false)")
    optimizer = state_lib.run_optimizer(config)
    model = analytic_model(config, cfg, optimizer, n, microbatches, repeats)
    sizes = model.sizes()
    start = time.perf_counter()
    cands, pruned = enumerate_candidates(n, axes, sizes, fixed,
                                         ordered=not profile.ici_spans_hosts,
                                         microbatches=model.pipeline_microbatches,
                                         repeats=model.pipeline_repeats)
    if not cands:
        raise LayoutError(
            f"no mesh of {n} devices over {','.join(axes)} divides the run's dimensions "
            f"(batch {sizes.batch} sequences, heads {sizes.heads}, d_ff {sizes.d_ff}, vocab "
            f"{sizes.vocab}{f', experts {sizes.experts}' if sizes.experts else ''}); choose a "
            f"device count that divides them (e.g. {_nearest_count(n, sizes)})")
    fitting, rest = estimate_candidates(model, cands, profile, budget_bytes, pruned)
    estimates = fitting + rest
    if not estimates:
        raise LayoutError(advice.advise(model, min(cands, key=model.state_bytes), budget_bytes,
                                        n, spelling=spelling))
    chosen = (fitting + rest)[:top]
    extra = [parse_include(t, axes, n) for t in include]
    for i, (text, c) in enumerate(zip(include, extra)):
        bad = [d for d in DIMS if (d != "experts" or sizes.experts) and sizes.of(d) % c.parts(d)]
        if bad:
            raise LayoutError(f"--include {text}: {bad[0]} ({sizes.of(bad[0])}) is not divisible "
                              f"by its mesh axes ({c.parts(bad[0])} devices); change the mesh "
                              "or drop it from the layout")
        extra[i] = _pipelined_include(text, c, model)
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
        cost = hardware.step_cost(program, profile, c.mesh)
        peak = m["memory"].get("peak_estimate_bytes")
        useful = model.model_flops / n
        rows.append({
            "mesh": c.mesh_text, "layout": c.layout_text,
            "stages": c.stages, "microbatches": c.microbatches if c.stages > 1 else 0,
            "repeats": c.repeats if c.stages > 1 else 1,
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
        print_fn(f"  compiled {c.mesh_text} {c.layout_text}{_pipe_text(rows[-1])}: peak "
                 f"{(peak or 0) / GIB:.2f} GiB, step {rows[-1]['step_ms']:.1f} ms"
                 + (" (cached)" if m["cached"] else f" (compiled in {m['compile_seconds']} s)"))
    rows.sort(key=lambda r: (not r["fits"], r["step_ms"] if r["fits"] else r["peak_bytes"] or 0))
    advised = None
    if rows and not rows[0]["fits"]:
        low = next(c for c, *_ in chosen if c.mesh_text == rows[0]["mesh"]
                   and c.layout_text == rows[0]["layout"])
        advised = advice.advise(model, low, budget_bytes, n, rows[0]["peak_bytes"], spelling)
    result = {"model": config.model, "devices": n, "hardware": profile.key,
              "budget_bytes": budget_bytes, "batch": model.batch, "lengths": model.lengths,
              "dtype": cfg.dtype, "remat": cfg.remat, "optimizer": config.optimizer,
              "enumerated": len(estimates) + sum(pruned.values()), "pruned": pruned,
              "estimated": len(estimates), "compiled": len(rows), "rows": rows,
              "winner": rows[0] if rows and rows[0]["fits"] else None, "advice": advised,
              "seconds": round(time.perf_counter() - start, 1)}
    print_fn(format_table(result))
    return result


def _pipelined_include(text: str, c: Candidate, model) -> Candidate:
    """An --include candidate with its pipeline's micro-batches and rounds (the search's)."""
    if c.stages == 1:
        return c
    stage = c.axes("layers")
    others = [d for d, a in c.rules if d != "layers" and set(a) & set(stage)]
    if len(stage) != 1 or others:
        raise LayoutError(f"--include {text}: a pipeline splits 'layers' over one mesh axis "
                          "that carries nothing else, e.g. stage:4,data:2/batch:data,"
                          "layers:stage")
    piped = model.pipelined(c)
    if piped is None:
        groups = "+".join(map(str, model.groups)) or "no (unscanned)"
        raise LayoutError(f"--include {text}: {c.stages} stages x {model.pipeline_repeats} "
                          f"repeats do not divide the {groups} layer groups, or the batch of "
                          f"{model.batch // model.accumulate} does not divide into micro-batches "
                          "its batch axes split; change the stages or --microbatches")
    return piped


def _pipe_text(row: dict) -> str:
    if row.get("stages", 1) == 1:
        return ""
    return (f" (pipeline: {row['stages']} stages, {row['microbatches']} micro-batches"
            + (f", {row['repeats']} repeats" if row["repeats"] > 1 else "") + ")")


def winner_flags(row: dict) -> str:
    """The run flags of a row: mesh and layout, and a pipeline's micro-batches and rounds."""
    out = f"--config.mesh={row['mesh']} --config.layout={row['layout']}"
    if row.get("stages", 1) > 1:
        out += (f" --config.scan_layers=true --config.pipeline_microbatches="
                f"{row['microbatches']}")
        if row["repeats"] > 1:
            out += f" --config.pipeline_repeats={row['repeats']}"
    return out


def _nearest_count(n: int, sizes: Sizes) -> int:
    for m in sorted(range(1, 4 * n + 1), key=lambda m: (abs(m - n), -m)):
        if m != n and sizes.batch % m == 0:
            return m
    return 1


def format_table(result: dict) -> str:
    head = ("#", "mesh", "layout", "peak GiB", "fits", "TFLOP/dev", "AR MiB", "AG MiB",
            "RS MiB", "A2A MiB", "CP MiB", "compute ms", "comm ms", "step ms", "MFU")
    piped = any(r.get("stages", 1) > 1 for r in result["rows"])
    if piped:                   # S,M,R: stages, micro-batches, rounds of a pipelined row
        head = head[:3] + ("S,M,R",) + head[3:]
    lines = [head]
    for i, r in enumerate(result["rows"], 1):
        b = r["bytes"]
        pipe = ((f"{r['stages']},{r['microbatches']},{r['repeats']}"
                 if r.get("stages", 1) > 1 else "-"),) if piped else ()
        lines.append((f"{i}{'*' if r.get('included') else ''}", r["mesh"], r["layout"], *pipe,
                      f"{(r['peak_bytes'] or 0) / GIB:.2f}",
                      "yes" if r["fits"] else "no", f"{r['flops'] / 1e12:.2f}",
                      *(f"{b[k] / 2 ** 20:.0f}" for k in hlo.KINDS),
                      f"{r['compute_ms']:.1f}", f"{r['communication_ms']:.1f}",
                      f"{r['step_ms']:.1f}", f"{100 * r['mfu']:.0f}%" if r["mfu"] else "-"))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    left = (1, 2, 5) if piped else (1, 2, 4)
    out = ["  ".join(c.ljust(w) if j in left else c.rjust(w)
                     for j, (c, w) in enumerate(zip(row, widths))) for row in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    if any(r.get("included") for r in result["rows"]):
        out.append("* asked for with --include (compiled beside the search's own candidates)")
    w = result["winner"]
    out.append(f"winner: {winner_flags(w)}" if w else
               f"no compiled candidate fits the budget; {result.get('advice') or ''}")
    return "\n".join(out)


def write_preset(name: str, result: dict, folder: pathlib.Path | None = None) -> pathlib.Path:
    """layouts/NAME.toml from the winner; refuses to overwrite a preset."""
    import importlib.resources
    from switchzoo import layout as layout_lib
    if not NAME.match(name):
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
    if w.get("stages", 1) > 1:
        doc += (f"; pipelined: run with {winner_flags(w).split(' ', 2)[2]}")
    path.write_text(f"doc = {json.dumps(doc)}\nmesh = {json.dumps(w['mesh'])}\n"
                    f"layout = {json.dumps(w['layout'])}\n")
    layout_lib.presets.cache_clear()
    return path
