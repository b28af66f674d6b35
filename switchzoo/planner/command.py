"""``python -m switchzoo.layout search`` and ``train.py --search_layout``: the layout search's
command line (switchzoo/planner/search.py does the work)."""
from __future__ import annotations

import json
import math
import pathlib
import sys

from switchzoo.layout import DEFAULT_AXES, NAME, LayoutError
from switchzoo.planner import advice, hardware
from switchzoo.planner import search as search_lib

GIB = search_lib.GIB


def load_config(text: str):
    """``configs/c4.py[:variant]`` (a clone's file, else the installed copy) -> ConfigDict."""
    import importlib.util
    from switchzoo import registry
    path, _, variant = text.partition(":")
    path = registry.config_path(path)
    if not pathlib.Path(path).is_file():
        raise LayoutError(f"--config {text}: no such file; give a run config such as "
                          "configs/c4.py")
    spec = importlib.util.spec_from_file_location("_search_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(variant or None)


def parse_fixed(text: str, axes: tuple[str, ...]) -> dict[str, int]:
    out = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        axis, _, size = entry.partition(":")
        if axis not in axes:
            from switchzoo import registry
            raise LayoutError(f"--fix {text}: unknown mesh axis '{axis}'"
                              f"{registry.suggest(axis, axes)}; the axes are {','.join(axes)} "
                              "(--axes)")
        if not size.isdigit() or int(size) < 1:
            raise LayoutError(f"--fix {text}: size of '{axis}' must be a positive integer")
        out[axis] = int(size)
    return out


def parse_axes(text: str) -> tuple[str, ...]:
    axes = tuple(a.strip() for a in text.split(",") if a.strip())
    bad = [a for a in axes if not NAME.match(a)]
    if not axes or bad or len(set(axes)) != len(axes):
        raise LayoutError(f"--axes {text!r}: give distinct axis names such as "
                          "data,model,expert")
    return axes


def run_config(config, devices: int, profile: str, memory_gib: float | None, axes: str,
               fix: str, top: int, cache: bool, as_json: bool, write: str | None,
               argv: list[str], include=(), spelling: str = "train",
               microbatches: int | None = None, repeats: int | None = None) -> int:
    """Checks the request, starts a process with ``devices`` simulated devices if this one
    lacks them, and searches (the command line and train.py --search_layout share this;
    ``spelling``: whose flags the advice names, "search" for this command's; ``microbatches``
    and ``repeats``: a pipelined candidate's, None: the config's)."""
    from switchzoo import simulated
    if devices is None or devices < 1:
        raise LayoutError("--devices N: give the number of devices to lay the run out on")
    prof = hardware.get(profile)
    axes_t = parse_axes(axes)
    fixed = parse_fixed(fix, axes_t)
    if math.prod(fixed.values()) and devices % math.prod(fixed.values()):
        raise LayoutError(f"--fix {fix}: the pinned sizes do not divide {devices} devices")
    if write and not NAME.match(write):
        raise LayoutError(f"--write {write!r}: a preset name is letters, digits and '_'")
    if memory_gib is not None and memory_gib <= 0:
        raise LayoutError(f"--memory-gib {memory_gib}: give a positive budget per device")
    if microbatches is not None and microbatches < 0 or repeats is not None and repeats < 1:
        raise LayoutError("--microbatches N (0: 4 x stages) and --repeats R (1: GPipe) take "
                          "N >= 0 and R >= 1")
    if search_lib.STAGE in axes_t and not config.scan_layers:
        raise LayoutError(f"--axes {axes}: the '{search_lib.STAGE}' axis pipelines scanned "
                          "layers; drop --no-scan")
    for text in include:
        search_lib.parse_include(text, axes_t, devices)             # a bad one fails before compiling
    if not simulated.use_cpu_devices(devices):
        return simulated.rerun_on_devices([sys.executable, *argv], devices)
    budget = (memory_gib * GIB) if memory_gib else prof.hbm_bytes
    result = search_lib.search(config, prof, budget, axes_t, fixed, top, cache,
                    print_fn=(lambda *_: None) if as_json else print, include=include,
                    spelling=spelling, microbatches=microbatches, repeats=repeats)
    if write:
        path = search_lib.write_preset(write, result)
        if not as_json:
            print(f"wrote {path} (use --config.layout={write})")
    if as_json:
        print(json.dumps(result))
    if not result["winner"]:
        print(f"error: no compiled layout fits {advice.gib_text(budget)} per device; "
              f"{result.get('advice')}", file=sys.stderr)
        return 1
    return 0


def parser():
    import argparse
    p = argparse.ArgumentParser(prog="python -m switchzoo.layout search",
                                description=search_lib.__doc__.splitlines()[0])
    p.add_argument("--model", help="catalogue name (default: the config's)")
    p.add_argument("--devices", type=int, required=True, help="devices to lay the run out on")
    p.add_argument("--hardware", required=True,
                   help=f"hardware profile: {', '.join(sorted(hardware.profiles()))}")
    p.add_argument("--memory-gib", type=float, help="budget per device (default: the "
                                                    "profile's memory)")
    p.add_argument("--config", default="configs/c4.py",
                   help="run config[:variant] for the task, batch and optimizer")
    p.add_argument("--batch", type=int, help="global batch in sequences (default: the "
                                             "config's per-device batch x devices)")
    p.add_argument("--length", type=int, help="input length (default: the config's)")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--remat", default="full", help="remat policy (default: full)")
    p.add_argument("--no-scan", action="store_true", help="unroll the layers (slower compiles)")
    p.add_argument("--optimizer", help="adafactor or adamw (default: the config's)")
    p.add_argument("--grad-accum", type=int, help="micro-batches per step (default: the "
                                                   "config's)")
    p.add_argument("--group-size", type=int, help="tokens per routing group (default: the "
                                                   "config's, else the catalogue's)")
    p.add_argument("--axes", default=",".join(DEFAULT_AXES),
                   help="mesh axes; 'stage' pipelines the layers over it (e.g. "
                        "stage,data,model,expert: the stage axis outermost)")
    p.add_argument("--microbatches", type=int, default=0,
                   help="with a stage axis: pipeline micro-batches per step (default 0: 4 x "
                        "stages, fewer where the batch does not divide)")
    p.add_argument("--repeats", type=int, default=1,
                   help="with a stage axis: rounds of a circular pipeline (default 1: GPipe)")
    p.add_argument("--fix", default="", help="pin axis sizes, e.g. model:8")
    p.add_argument("--top", type=int, default=6, help="candidates to compile")
    p.add_argument("--include", action="append", default=[], metavar="MESH/LAYOUT",
                   help="also compile and rank this one (repeatable), e.g. "
                        "data:4,model:1,expert:8/dp_ep")
    p.add_argument("--no-cache", action="store_true", help="recompile cached candidates")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--write", help="save the winner as layouts/NAME.toml")
    p.add_argument("--verbose", action="store_true", help="full tracebacks on errors")
    return p


def config_from_args(args):
    """The run config the search weighs: ``--config`` with this command's overrides."""
    if args.batch is not None and (args.batch < 1 or args.batch % args.devices):
        fits = [d for d in range(1, max(args.batch, 1) + 1) if args.batch % d == 0]
        near = sorted(fits, key=lambda d: abs(d - args.devices))[:2]
        raise LayoutError(
            f"--batch {args.batch}: no mesh of {args.devices} devices splits "
            f"{args.batch} sequences evenly (each device holds a whole number of them); "
            f"give a positive multiple of --devices {args.devices} as --batch, or "
            f"--devices {' or '.join(map(str, sorted(near)))}")
    if args.top < 1:
        raise LayoutError("--top: compile at least one candidate")
    if (args.microbatches or args.repeats != 1) and search_lib.STAGE not in parse_axes(args.axes):
        raise LayoutError(f"--microbatches / --repeats are read only with a pipeline: add the "
                          f"'{search_lib.STAGE}' axis, e.g. --axes {search_lib.STAGE},"
                          f"{args.axes}")
    config = load_config(args.config)
    if args.model:
        from switchzoo import zoo
        zoo.get(args.model)
        config.model = args.model
    _check_task(config, args.config)
    config.dtype, config.remat, config.scan_layers = args.dtype, args.remat, not args.no_scan
    if args.optimizer:
        config.optimizer = args.optimizer
    if args.length:
        config.max_length = args.length
    if args.batch:
        config.per_device_batch_size = args.batch // args.devices
    if args.grad_accum is not None:
        config.grad_accum_steps = args.grad_accum
    if args.group_size is not None:
        config.moe.group_size = args.group_size
    # a stage axis's pipeline (the search compiles each pipelined candidate with these; the
    # others with the fields' defaults)
    config.pipeline_microbatches, config.pipeline_repeats = args.microbatches, args.repeats
    return config


def _check_task(config, config_text: str) -> None:
    """The model must suit the config's task; the fix names this command's flags."""
    from switchzoo import zoo
    if config.get("init_from"):
        return                                  # the checkpoint's model: checked when read
    encoder_decoder = zoo.get(config.model).is_encoder_decoder
    if encoder_decoder != (config.task != "lm"):
        kind, other, example, task_config = (
            ("an encoder-decoder", "a decoder-only", "switch_tiny", "configs/c4.py")
            if encoder_decoder else
            ("a decoder-only", "an encoder-decoder", "switch_base_8", "configs/lm1b.py"))
        raise LayoutError(f"--model {config.model} is {kind} model, and --config {config_text} "
                          f"trains task '{config.task}', which needs {other} one; give "
                          f"--config {task_config}, or {other} --model such as {example}")


def main(argv=None) -> int:
    argv = sys.argv[2:] if argv is None else argv
    args = parser().parse_args(argv)
    try:
        config = config_from_args(args)
        return run_config(config, args.devices, args.hardware, args.memory_gib, args.axes,
                          args.fix, args.top, not args.no_cache, args.json, args.write,
                          ["-m", "switchzoo.layout", "search", *argv], args.include,
                          spelling="search", microbatches=args.microbatches,
                          repeats=args.repeats)
    except (ValueError, KeyError) as e:
        if args.verbose:
            raise
        from switchzoo import errors
        print(f"error: {errors.one_line(e)}", file=sys.stderr)
        return 2
