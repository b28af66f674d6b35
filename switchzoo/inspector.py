"""The layout inspector: where every tensor lives, what it costs per device, which
collectives the compiled train step runs and how much memory it needs per device.
``python -m switchzoo.layout --help``.

Nothing is allocated: the state is abstract (shapes only), so ``--devices N`` can stand in
for a whole pod on one host (N simulated CPU devices) and compile its real train step.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import sys
import time

import jax
import numpy as np

from switchzoo import layout as layout_lib
from switchzoo import moe as moe_lib
from switchzoo import pipeline
from switchzoo import state as state_lib
from switchzoo import simulated, steps, zoo
from switchzoo.config import ATTENTION, REMAT
from switchzoo.attention_impl import attention_impl

COLLECTIVES = ("all-to-all", "all-reduce", "all-gather", "reduce-scatter", "collective-permute")
# An instruction is "%name = SHAPE op(operands)"; SHAPE may be a tuple with spaces in it.
_OP = re.compile(r"\s(%s)(?:-start)?\(" % "|".join(COLLECTIVES))


def count_collectives(hlo_text: str) -> dict[str, int]:
    """Collective ops in compiled HLO text by kind (an async pair counts once, by its start)."""
    counts = collections.Counter(m.group(1) for m in _OP.finditer(hlo_text))
    return {kind: counts.get(kind, 0) for kind in COLLECTIVES}


def _bytes_per_device(tree, shardings) -> int:
    sizes = jax.tree.map(lambda x, s: layout_lib.nbytes(s.shard_shape(x.shape), x.dtype),
                         tree, shardings)
    return int(sum(jax.tree.leaves(sizes)))


def memory_stats(compiled) -> dict[str, int]:
    """Per-device bytes of a compiled step (``compiled.memory_analysis()``).

    ``argument_bytes``: the inputs (state and batch shard); ``output_bytes``: the outputs;
    ``alias_bytes``: outputs that reuse a donated input's buffer (the new state); ``temp_bytes``:
    the temporaries (activations, gradients, ...) after XLA's buffer reuse;
    ``generated_code_bytes``: the executable. ``peak_estimate_bytes`` = argument + output - alias
    + temp: everything that can be live at once, counting aliased outputs once. It is an upper
    bound of the buffers (it assumes every temporary is live while all inputs and outputs are)
    and leaves out the executable and the runtime's own memory. The numbers are those of the
    backend that compiled the step: on simulated CPU devices they show the sharding's effect
    (what each device holds) but fusion and layouts, hence temporaries, differ on TPU/GPU.
    """
    m = compiled.memory_analysis()
    if m is None:                     # a backend without the analysis
        return {}
    out = {"argument_bytes": int(m.argument_size_in_bytes),
           "output_bytes": int(m.output_size_in_bytes),
           "alias_bytes": int(m.alias_size_in_bytes),
           "temp_bytes": int(m.temp_size_in_bytes),
           "generated_code_bytes": int(m.generated_code_size_in_bytes)}
    out["peak_estimate_bytes"] = (out["argument_bytes"] + out["output_bytes"]
                                  - out["alias_bytes"] + out["temp_bytes"])
    return out


# XLA's CPU compiler rewrites each all-to-all over N devices into N slices, an N-operand tuple
# all-to-all and an N-way concatenate (the form its runtime executes); TPU and GPU keep one array
# all-to-all. With thousands of simulated devices that is hundreds of thousands of instructions,
# and compiling them outgrows the host: Switch-C's step on 1,024 CPU devices spent 3 minutes in
# layout assignment, then passed 15 GiB within a minute of the fusion pass. The inspector
# compiles to inspect, never runs the step, so on CPU it leaves the array form alone.
_CPU_NO_DECOMPOSER = "all_to_all_decomposer"


def cpu_inspect_options() -> dict:
    """Compiler options for an inspection on CPU: XLA_FLAGS' disabled passes plus the above."""
    flags = re.findall(r"--xla_disable_hlo_passes=(\S+)", os.environ.get("XLA_FLAGS", ""))
    return {"xla_disable_hlo_passes": ",".join(flags + [_CPU_NO_DECOMPOSER])}


def inspect(model: str, mesh: str, layout: str, optimizer: str = "adamw",
            batch_size: int | None = None, length: int = 64, compile_step: bool = True,
            group_size: int | None = None, decompose_all_to_all: bool = False,
            dtype: str = "float32", scan_layers: bool = False, remat: str = "none",
            attention: str = "auto", microbatches: int = 0, repeats: int = 1) -> dict:
    """The inspector's report (the --json object). Nothing is allocated: shapes are abstract.

    ``batch_size`` is the global batch in sequences (default: two per device), ``length`` the
    length of the inputs and of the targets; ``group_size`` overrides the catalogue's routing
    group (tokens routed together). ``decompose_all_to_all`` keeps the CPU compiler's
    all-to-all rewrite (see _CPU_NO_DECOMPOSER; off by default, no effect off CPU).
    ``dtype`` (activations), ``scan_layers``, ``remat``, ``attention`` and (with 'layers:stage'
    in the layout) ``microbatches`` and ``repeats`` as the ModelConfig fields."""
    cfg = zoo.get(model).replace(dtype=dtype, scan_layers=scan_layers, remat=remat,
                                 attention=attention, pipeline_microbatches=microbatches,
                                 pipeline_repeats=repeats)
    if group_size is not None:
        if cfg.moe is None:
            raise ValueError(f"--group-size: {model} has no Switch layers to route")
        cfg = cfg.replace(moe=dataclasses.replace(cfg.moe, group_size=group_size))
    setup = state_lib.setup(cfg, layout, mesh, optimizer=optimizer)
    mesh_obj, lay, abstract, shardings = setup.mesh, setup.layout, setup.abstract, setup.shardings
    batch_size = batch_size or 2 * mesh_obj.size
    tensors = []
    flat, _ = jax.tree_util.tree_flatten_with_path(abstract.params)
    flat_sh = jax.tree.leaves(shardings.params)
    for (path, x), s in zip(flat, flat_sh):
        local = s.shard_shape(x.shape)
        name = state_lib.path_name(path)
        tensors.append({"name": name, "shape": list(x.shape), "dims": list(setup.dims[name]),
                        "spec": [list(e) if isinstance(e, tuple) else e for e in s.spec],
                        "per_device_shape": list(local),
                        "per_device_bytes": layout_lib.nbytes(local, x.dtype)})
    report = {
        "devices": int(mesh_obj.size),
        "mesh": {k: int(v) for k, v in mesh_obj.shape.items()},
        "layout": lay.text,
        "model": model,
        "optimizer": optimizer,
        "dtype": dtype, "scan_layers": scan_layers, "remat": remat,
        "attention": str(attention_impl(cfg)),
        "pipeline": _pipeline(lay, cfg, [setup.dims[t["name"]] for t in tensors
                                         if "scanned" in t["name"]],
                              batch_size),
        "params_bytes_total": int(sum(layout_lib.nbytes(x.shape, x.dtype)
                                      for x in jax.tree.leaves(abstract.params))),
        "params_bytes_per_device_max": _bytes_per_device(abstract.params, shardings.params),
        "opt_bytes_per_device_max": _bytes_per_device(abstract.opt_state, shardings.opt_state),
        "tensors": tensors,
    }
    if compile_step:
        step = steps.make_train_step(setup)
        batch = {k: jax.ShapeDtypeStruct((batch_size, length), dt) for k, dt in
                 (("inputs", np.int32), ("targets", np.int32), ("weights", np.float32))}
        start = time.perf_counter()
        lowered = step.lower(abstract, batch)
        lowered_at = time.perf_counter()
        on_cpu = mesh_obj.devices.flat[0].platform == "cpu"
        compiled = lowered.compile(None if decompose_all_to_all or not on_cpu
                                   else cpu_inspect_options())
        report["batch"], report["length"] = batch_size, length
        if cfg.moe is not None:
            report["group_size"] = cfg.moe.group_size
            report["routing_groups"] = moe_lib.num_groups(batch_size, length, cfg.moe.group_size,
                                                          lay.parts("groups"))
        # compile_seconds: tracing, lowering and compiling (lower_seconds: the first two).
        report["compile_seconds"] = round(time.perf_counter() - start, 2)
        report["lower_seconds"] = round(lowered_at - start, 2)
        report["collectives"] = count_collectives(compiled.as_text())
        report["memory"] = memory_stats(compiled)
    return report


def _pipeline(lay, cfg, stacked_dims: list, batch: int) -> dict | None:
    """The pipeline schedule the layout and model ask for (None: no stage axis), and how each
    stage runs per batch shard (``per_shard``: the batch's axes, whether the experts are cut
    or copied, and the axes they are cut over (``experts_over``); None where the stages run
    unsharded)."""
    p = pipeline.plan(lay, cfg)
    if p is None:
        return None
    sh = pipeline.shards(lay, stacked_dims, batch // p.microbatches)
    return {"axis": p.axis, "stages": p.stages, "microbatches": p.microbatches,
            "repeats": p.repeats, "iterations": p.iterations, "bubble": round(p.bubble, 4),
            "batch_shards": lay.parts("batch"), "per_shard": None if sh is None else {
                "axes": list(sh.axes), "shards": sh.count,
                "experts": "cut" if any(sh.cut) else "copied",
                "experts_over": list(sh.experts_over) if any(sh.cut) else []}}


def format_table(report: dict) -> str:
    rows = [("tensor", "dims", "spec", "per-device shape", "bytes/device")]
    for t in report["tensors"]:
        spec = ",".join("-" if e is None else "+".join(e) if isinstance(e, list) else e
                        for e in t["spec"]) or "replicated"
        rows.append((t["name"], ",".join(t["dims"]), spec,
                     "x".join(map(str, t["per_device_shape"])) or "()",
                     f"{t['per_device_bytes']:,}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"mesh {report['mesh']} ({report['devices']} devices) | layout {report['layout']}", ""]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) if j < 4 else c.rjust(w)
                               for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    total, per = report["params_bytes_total"], report["params_bytes_per_device_max"]
    lines += ["", f"parameters: {total:,} bytes in all, {per:,} per device "
                  f"({per / total:.3f} of the total)",
              f"optimizer state: {report['opt_bytes_per_device_max']:,} bytes per device"]
    if report.get("pipeline"):
        p = report["pipeline"]
        lines.append(f"pipeline: {p['stages']} stages on '{p['axis']}', {p['microbatches']} "
                     f"micro-batches, {p['repeats']} round(s): {p['iterations']} iterations, "
                     f"bubble {p['bubble']:.1%} of each stage's time")
        sh = p.get("per_shard")
        if sh is None and p.get("batch_shards", 1) > 1:
            lines.append("each stage runs unsharded (an expert weight is split over the batch's "
                         "axes other than by its experts over a leading or trailing run of "
                         "them, or the micro-batch rows do not split over them): its weights' "
                         "gradients are all-reduced every iteration")
        elif sh is not None:
            over = sh.get("experts_over", sh["axes"])
            holds = ("a copy of the stage's weights each" if sh["experts"] != "cut" else
                     ("each shard" if over == sh["axes"] else f"each shard of {'+'.join(over)}")
                     + " its own experts (all_to_all), a copy of the other weights")
            lines.append(f"each stage runs per batch shard ({sh['shards']} over "
                         f"{'+'.join(sh['axes'])}): {holds}; their gradients are summed once "
                         "a step")
    if "collectives" in report:
        groups = (f", {report['routing_groups']} routing groups of {report['group_size']}"
                  if "routing_groups" in report else "")
        lines.append(f"train step collectives (batch {report['batch']} x {report['length']}"
                     f"{groups}, compiled in {report['compile_seconds']} s): " +
                     ", ".join(f"{k} {v}" for k, v in report["collectives"].items()))
    if report.get("memory"):
        m = report["memory"]
        lines.append(f"train step memory per device: arguments {m['argument_bytes']:,}, outputs "
                     f"{m['output_bytes']:,} ({m['alias_bytes']:,} aliased to donated "
                     f"arguments), temporaries {m['temp_bytes']:,} bytes; peak estimate "
                     f"{m['peak_estimate_bytes']:,} bytes ({_gib(m['peak_estimate_bytes'])}; "
                     "arguments + outputs - aliased + temporaries)")
    return "\n".join(lines)


def _gib(n: int) -> str:
    return f"{n / 2 ** 30:.2f} GiB"


def block_owners(sharding, shape) -> dict[tuple, list[int]]:
    """{block as ((start, stop), ...) per dim: [device ids holding it]} — which processor
    holds which slice, the content of the Mesh-TensorFlow paper's figures 2-4."""
    owners: dict[tuple, list[int]] = collections.defaultdict(list)
    for device, index in sharding.devices_indices_map(tuple(shape)).items():
        block = tuple(s.indices(n)[:2] for s, n in zip(index, shape))
        owners[block].append(device.id)
    return {b: sorted(d) for b, d in sorted(owners.items())}


def draw(sharding, shape, dims, title: str, path: str) -> None:
    """Draws a tensor as a grid of its blocks, each labelled with the devices that hold it.
    Rank > 2 tensors are drawn over their last two dims, one panel per leading block."""
    from matplotlib.figure import Figure    # no pyplot: leaves the caller's backend alone
    from matplotlib import colormaps
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import MaxNLocator

    owners = block_owners(sharding, shape)
    shape2 = ((1, 1) + tuple(shape))[-2:]
    dims2 = (("", "") + tuple(dims))[-2:]
    panels = collections.defaultdict(dict)
    for block, devices in owners.items():
        block = ((0, 1), (0, 1)) + block
        panels[block[:-2]][block[-2:]] = devices
    n = len(panels)
    fig = Figure(figsize=(3.2 * n + 1, 3.4))
    axes = fig.subplots(1, n, squeeze=False)
    cmap = colormaps["tab20"]
    holders = sorted(set(map(tuple, owners.values())))
    colours = {d: cmap(i % 20) for i, d in enumerate(holders)}
    for ax, (lead, blocks) in zip(axes[0], sorted(panels.items())):
        for ((r0, r1), (c0, c1)), devices in blocks.items():
            ax.add_patch(Rectangle((c0, r0), c1 - c0, r1 - r0, ec="black",
                                   fc=colours[tuple(devices)], alpha=0.6))
            label = ",".join(map(str, devices)) if len(devices) <= 4 else f"{len(devices)} devices"
            ax.text((c0 + c1) / 2, (r0 + r1) / 2, label, ha="center", va="center", fontsize=8)
        ax.set_xlim(0, shape2[1]); ax.set_ylim(shape2[0], 0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(dims2[1]); ax.set_ylabel(dims2[0])
        lead = [f"{d}[{a}:{b}]" for d, (a, b) in zip(dims[:-2], lead[2:])]
        ax.set_title(" ".join(lead), fontsize=8)
    spec = ", ".join(str(e) for e in sharding.spec) or "replicated"
    fig.suptitle(f"{title}  {tuple(shape)}  spec ({spec})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m switchzoo.layout", description=__doc__)
    parser.add_argument("--model", required=True, help="catalogue name, e.g. switch_tiny")
    parser.add_argument("--mesh", default="", help="e.g. data:2,model:2,expert:2 "
                                                   "(default: the preset's mesh)")
    parser.add_argument("--layout", default="dp_mp_ep", help="preset name or layout string")
    parser.add_argument("--optimizer", default="adamw", help="adamw or adafactor")
    parser.add_argument("--batch", "--batch-size", dest="batch_size", type=int, default=None,
                        help="global batch in sequences (default: 2 per device)")
    parser.add_argument("--length", type=int, default=64,
                        help="sequence length of the inputs and of the targets")
    parser.add_argument("--group-size", type=int, default=None,
                        help="tokens per routing group (default: the catalogue's)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="activation dtype (parameters and router stay float32)")
    parser.add_argument("--scan-layers", action="store_true",
                        help="scan each stack's repeating group of layers")
    parser.add_argument("--microbatches", type=int, default=0,
                        help="pipeline micro-batches, with 'layers:stage' in the layout (0: one "
                             "per stage)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds of a circular pipeline schedule (1: GPipe)")
    parser.add_argument("--remat", default="none", choices=REMAT,
                        help="rematerialise each block in the backward pass")
    parser.add_argument("--attention", default="auto", choices=ATTENTION,
                        help="attention implementation (auto: cuDNN's fused kernel on a GPU in "
                             "bfloat16, else the reference einsums)")
    parser.add_argument("--devices", type=int, default=None,
                        help="run on N simulated CPU devices (a pod-sized dry run on one host)")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip compiling the train step (no collectives, no memory analysis)")
    parser.add_argument("--cpu-decompose-all-to-all", action="store_true",
                        help="on CPU, let XLA split each all-to-all per device as it does to "
                             "run one (slow, and memory-hungry with thousands of devices)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--figure", help="write a PNG of one tensor's blocks (needs --tensor)")
    parser.add_argument("--tensor", help="parameter name as in the table, e.g. decoder/layers/1/ffn/wi")
    parser.add_argument("--verbose", action="store_true", help="full tracebacks on errors")
    args = parser.parse_args(argv)
    if args.devices is not None:
        if args.devices < 1:
            print(f"error: --devices {args.devices}: give a positive number of devices",
                  file=sys.stderr)
            return 2
        if not simulated.use_cpu_devices(args.devices):
            return simulated.rerun_on_devices([sys.executable, "-m", "switchzoo.layout",
                                     *(sys.argv[1:] if argv is None else argv)], args.devices)
    try:
        if bool(args.figure) != bool(args.tensor):
            raise ValueError("--figure and --tensor go together: --figure out.png --tensor NAME")
        mesh = args.mesh or _preset_mesh(args.layout)
        report = inspect(args.model, mesh, args.layout, args.optimizer, args.batch_size,
                         args.length, not args.no_compile, args.group_size,
                         args.cpu_decompose_all_to_all, args.dtype, args.scan_layers, args.remat,
                         args.attention, args.microbatches, args.repeats)
        if args.figure:
            _figure(report, args)
    except (ValueError, KeyError) as e:
        if args.verbose:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report) if args.json else format_table(report))
    return 0


def _preset_mesh(layout: str) -> str:
    preset = layout_lib.presets().get(layout)
    if preset is None:
        raise ValueError("--mesh is needed with a literal layout string (e.g. "
                         "--mesh data:2,model:2,expert:2)")
    return preset.mesh


def _figure(report: dict, args) -> None:
    names = {t["name"]: t for t in report["tensors"]}
    if args.tensor not in names:
        raise ValueError(f"--tensor {args.tensor!r} is not a parameter of {args.model}; "
                         f"names are listed in the table, e.g. {next(iter(names))}")
    t = names[args.tensor]
    lay = layout_lib.Layout.create(args.layout, args.mesh or _preset_mesh(args.layout))
    draw(lay.sharding(t["dims"], t["shape"], t["name"]), t["shape"], t["dims"],
         f"{args.model} {t['name']}", args.figure)


if __name__ == "__main__":
    sys.exit(main())
