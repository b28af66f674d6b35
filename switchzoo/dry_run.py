"""``train.py --dry_run``: compile a run config's real train step for its mesh, on simulated CPU
devices, from abstract state (nothing allocated, nothing written), and report per-device
memory, collectives and compile time — a pod-sized config checked on one host before booking
the pod.

    python train.py --config=configs/c4.py:model=switch_base_128 --dry_run   # the paper's 32 cores

The batch is the run's: global batch x max_length inputs and, for span corruption, targets of
span_corruption.lengths (114 for 512), with the packing fields the pipeline feeds. The
vocabulary is data.vocab_size plus the 100 sentinel ids (the catalogue rounds it to 128s), or
the vocab_path model's; with init_from, the model it names. Numbers are
XLA:CPU's for the per-device program (see switchzoo/inspector.py); float32 or bfloat16
activations, scanned or unrolled layers and rematerialisation as the config says
(``--config.dtype=bfloat16 --config.scan_layers=true --config.remat=full``: the paper's
bfloat16 and bench/pod.py's settings; docs/benchmarks.md has what fits 16 GiB per core).
"""
from __future__ import annotations

import math
import pathlib
import sys
import time

import jax
import numpy as np

from switchzoo import inspector, layout as layout_lib, machine, simulated, validate, weights
from switchzoo import state as state_lib
from switchzoo.data import span_corruption, tokenizer as tokenizer_lib
from switchzoo.attention_impl import attention_impl


def devices_needed(config, devices: int | None) -> int:
    """The device count of the config's mesh (``devices`` where the mesh leaves one open)."""
    if devices is not None and devices < 1:
        raise ValueError(f"--devices {devices}: give a positive number of devices")
    mesh = config.mesh
    if not mesh:
        preset = layout_lib.presets().get(config.layout)
        if preset is None:
            raise ValueError("--dry_run with a literal layout string needs --config.mesh "
                             "(e.g. data:4,model:1,expert:8)")
        mesh = preset.mesh
    sizes = layout_lib.mesh_sizes(mesh).shape
    if -1 in sizes:
        if devices is None:
            raise ValueError(f"mesh '{mesh}' leaves an axis open (-1): give --devices N, or a "
                             "mesh with every size (--config.mesh=data:4,model:1,expert:8)")
        return devices
    n = math.prod(sizes)
    if devices is not None and devices != n:
        raise ValueError(f"--devices {devices} but mesh '{mesh}' has {n} devices; drop "
                         "--devices or change --config.mesh")
    return n


def ensure_devices(n: int, argv: list[str]) -> int | None:
    """None when this process has ``n`` devices; else the exit code of a fresh process that
    runs ``argv`` on ``n`` simulated CPU devices."""
    if simulated.use_cpu_devices(n):
        return None
    return simulated.rerun_on_devices([sys.executable, *argv], n)


def vocab_size(config) -> int:
    if config.data.vocab_path:
        path = pathlib.Path(config.data.vocab_path).expanduser()
        return tokenizer_lib.Tokenizer(path.read_bytes(), str(path)).vocab_size
    return config.data.vocab_size + tokenizer_lib.EXTRA_IDS


def batch_shapes(config, batch: int) -> dict:
    """The run's batch fields and shapes, as the input pipeline makes them."""
    from switchzoo.data import pipeline
    T = (span_corruption.lengths(config.max_length, config.data.noise_density,
                                 config.data.mean_noise_span_length)[1]
         if config.task == "span_corruption" else
         config.finetune.target_length or config.max_length)
    one = {"inputs": np.ones(1, np.int32), "targets": np.ones(1, np.int32)}
    words = [1] if config.task == "lm" else None
    fields = next(pipeline.eval_batches([one], config.task, batch, config.max_length, words, T))
    # Evaluation's word counts and row lengths (its rows are unpacked) are not training fields.
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in fields.items()
            if k != "num_words" and not k.endswith("lengths")}


def compile_step(config):
    """(compiled, setup, batch, seconds): the config's train step compiled for its mesh on this
    process's devices, from abstract state (what the dry run and the layout search read)."""
    from switchzoo import steps
    validate.check(config)
    if config.distill.teacher:
        raise ValueError("--dry_run compiles the run's step without a distillation teacher's "
                         "forward pass and parameters, so its memory would be too low; drop "
                         "--config.distill.teacher to compile the student's step alone")
    layout = state_lib.run_layout(config)
    state_lib.check_accumulation(config)
    origin = weights.resolve(config.init_from).cfg if config.init_from else None
    cfg = state_lib.run_model_config(config, vocab_size(config), origin)
    setup = state_lib.setup_run(config, layout, cfg)
    batch = batch_shapes(config, state_lib.global_batch_size(config))
    step = steps.make_train_step(setup, config.label_smoothing, config.grad_accum_steps,
                                 loss_chunk=config.loss_chunk)
    start = time.perf_counter()
    lowered = step.lower(setup.abstract, batch)
    compiled = lowered.compile(inspector.cpu_inspect_options()
                               if jax.default_backend() == "cpu" else None)
    return compiled, setup, batch, time.perf_counter() - start


def run(config, print_fn=print) -> dict:
    """Compiles the config's train step on this process's devices; returns the report."""
    compiled, setup, batch, seconds = compile_step(config)
    layout = setup.layout
    memory = inspector.memory_stats(compiled)
    params = sum(x.size for x in jax.tree.leaves(setup.abstract.params))
    report = {"model": config.model, "task": config.task, "devices": int(layout.mesh.size),
              "mesh": {k: int(v) for k, v in layout.mesh.shape.items()}, "layout": layout.text,
              "batch": {k: list(v.shape) for k, v in batch.items()
                        if k in ("inputs", "targets")},
              "dtype": config.dtype, "scan_layers": config.scan_layers, "remat": config.remat,
              "attention": str(attention_impl(setup.cfg)),
              "optimizer": config.optimizer, "params": int(params),
              "compile_seconds": round(seconds, 1), "memory": memory,
              "collectives": inspector.count_collectives(compiled.as_text()),
              "machine": machine.describe()}
    gib = 2 ** 30
    peak = memory.get("peak_estimate_bytes")
    print_fn(f"dry run: {config.model} ({params:,} parameters), task {config.task}, mesh "
             f"{report['mesh']}, layout {layout.text}, batch inputs {report['batch']['inputs']} "
             f"targets {report['batch']['targets']}, {config.dtype}, {config.optimizer}, "
             f"{'scanned' if config.scan_layers else 'unrolled'} layers, remat {config.remat}, "
             f"attention {attention_impl(setup.cfg)}")
    print_fn(f"compiled in {seconds:.1f} s; per device: arguments "
             f"{memory.get('argument_bytes', 0) / gib:.2f} GiB, temporaries "
             f"{memory.get('temp_bytes', 0) / gib:.2f} GiB"
             + (f", peak estimate {peak / gib:.2f} GiB" if peak is not None else "")
             + f"; collectives {report['collectives']}")
    print_fn(f"machine: {machine.line(report['machine'])} (the compile time is this "
             "machine's; memory and collectives are the mesh's program)")
    return report
