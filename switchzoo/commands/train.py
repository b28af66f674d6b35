"""Train a switchzoo model; re-running the same command resumes from the newest checkpoint.

    python train.py --config=configs/demo.py --workdir=DIR [--config.num_train_steps=...]
    switchzoo-train --config=configs/demo.py --workdir=DIR      # an installed package
    python train.py --config=configs/c4.py --dry_run   # compile for the config's mesh, no run

``--config=configs/NAME.py`` is the file in this directory when there is one, else the copy
installed with the package (switchzoo.configs).

The entry points (the script and the installed command) call switchzoo.commands.entry.train,
which first re-runs the process with glibc's huge-page tunable (entry.huge_pages_env);
``python -m`` on this module skips that.
"""
import math
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from switchzoo import dry_run, loop, registry, validate, zoo
from switchzoo import layout as layout_lib
from switchzoo import state as state_lib
from switchzoo.commands import cli

config_flags.DEFINE_config_file("config", registry.config_path("configs/demo.py"),
                                "Run config (file.py[:variant]).")
flags.DEFINE_string("workdir", None, "Checkpoints, metrics, tokenizer and config.json go here "
                    "(required unless --dry_run).")
flags.DEFINE_bool("dry_run", False, "Compile the train step for the config's mesh on simulated "
                  "CPU devices (abstract state: nothing allocated or written) and report "
                  "per-device memory, collectives and compile time.")
flags.DEFINE_integer("devices", None, "--dry_run: the device count where the mesh leaves an "
                     "axis open (-1); --search_layout: the devices to lay out on (default: the "
                     "config mesh's).")
flags.DEFINE_bool("search_layout", False, "Search the mesh and layout for the config's model, "
                  "batch, dtype, remat and optimizer on --devices devices of --hardware "
                  "(python -m switchzoo.layout search; nothing is run or written).")
flags.DEFINE_string("hardware", None, "--search_layout: hardware profile (layouts/hardware/: "
                    "tpu_v3, tpu_v4, tpu_v5e, a100, h100).")
flags.DEFINE_float("memory_gib", None, "--search_layout: memory budget per device (default: "
                   "the profile's).")
flags.DEFINE_string("write_layout", None, "--search_layout: save the winner as layouts/NAME.toml.")
flags.DEFINE_bool("lock", True, "Hold the workdir's lock file while the run writes it (flock). "
                  "--nolock: on a filesystem without file locks (some NFS, Lustre and FUSE "
                  "mounts), at your own risk: run one train.py per workdir yourself.")
flags.DEFINE_bool("check", False, "Check the flags and the config (settings, model, layout "
                  "and mesh) as the command would, then stop: nothing is run, compiled or "
                  "written.")
flags.DEFINE_bool("verbose", False, "Show full tracebacks on errors.")
cli.define_distributed_flags()


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)   # JAX's backend probing is noise here
    f = flags.FLAGS
    search_only = [n for n in ("hardware", "memory_gib", "write_layout") if f[n].present]
    if search_only and not f.search_layout:
        cli.bad_flag(f"--{search_only[0]} is read only with --search_layout; drop it or add "
                     "--search_layout")
    if f["lock"].present and (f.search_layout or f.dry_run):
        cli.bad_flag("--nolock is read only by a run that writes a --workdir; drop it")
    if f.search_layout:
        if f.dry_run or f.workdir:
            cli.bad_flag("--search_layout runs nothing and writes no workdir: drop "
                         f"{'--dry_run' if f.dry_run else '--workdir'}")
        cli.refuse_distributed_flags("--search_layout compiles on simulated devices and")
        cli.run(lambda: _check(f) if f.check else _search_layout(f))
    elif f.dry_run:
        cli.refuse_distributed_flags("--dry_run compiles on simulated devices and")
        cli.run(lambda: _check(f) if f.check else _dry_run(f))
    elif f.devices is not None:
        cli.bad_flag("--devices is read only with --dry_run; drop it (a run uses the devices "
                     "JAX has)")
    elif not f.workdir:
        cli.bad_flag("--workdir is required: the directory for checkpoints, metrics and "
                     "config.json (or --dry_run to only compile)")
    elif f.check:
        cli.run(lambda: _check(f))
    else:
        cli.run(lambda: (cli.initialize_distributed(),
                         loop.train(f.config, f.workdir, lock=f.lock)))


def _check(f) -> None:
    """--check: the refusals the command would give before it starts (flags, settings, model,
    layout on the config's mesh shape, batch and accumulation), with nothing run or written.
    The mesh is checked as a shape, whatever this machine has: an axis left open (-1) takes
    --devices, else what this machine's devices give it (at least 1)."""
    config = f.config
    validate.check(config)
    zoo.entry(config.model)
    layout = config.layout or "data_parallel"
    mesh = config.mesh or getattr(layout_lib.presets().get(layout), "mesh", "data:-1")
    sizes = layout_lib.mesh_sizes(mesh).shape
    fixed = math.prod(n for n in sizes if n != -1)
    devices = f.devices or (fixed * max(1, jax.device_count() // fixed) if -1 in sizes
                            else fixed)
    spec = layout_lib.parse_mesh(mesh, devices)
    layout_lib.parse_layout(layout_lib.layout_string(layout), tuple(spec.axes))
    state_lib.check_accumulation(config, config.per_device_batch_size * math.prod(spec.shape))
    print(f"check: model {config.model}, task {config.task}, mesh {mesh} "
          f"({math.prod(spec.shape)} devices), layout {layout}: the flags and the config hold "
          "(nothing was run or written)")


def _search_layout(f) -> None:
    from switchzoo.planner import command
    if not f.hardware:
        raise ValueError("--search_layout needs --hardware (tpu_v3, tpu_v4, tpu_v5e, a100, h100)")
    devices = f.devices or dry_run.devices_needed(f.config, None)   # default: the config mesh's
    code = command.run_config(f.config, devices, f.hardware, f.memory_gib, "data,model,expert",
                             "", 6, True, False, f.write_layout, sys.argv)
    if code:
        sys.exit(code)


def _dry_run(f) -> None:
    if f.workdir:
        raise ValueError("--dry_run writes nothing: drop --workdir")
    code = dry_run.ensure_devices(dry_run.devices_needed(f.config, f.devices), sys.argv)
    if code is None:
        dry_run.run(f.config)
    elif code:
        sys.exit(code)


def run():
    app.run(main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
    run()
