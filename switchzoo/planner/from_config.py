"""The estimate's model of a run config (switchzoo.planner.estimate.Model): its weights from
the abstract model, its stacks at the run's lengths, the optimizer's bytes per parameter."""
from __future__ import annotations

import jax
import numpy as np

from switchzoo import scanned
from switchzoo import state as state_lib
from switchzoo.data import span_corruption
from switchzoo.planner.estimate import Model, Weight, stacks_of, weight_role


def run_lengths(config, cfg) -> tuple[int, ...]:
    """Tokens per sequence per stack: span corruption's inputs and targets; else the run's
    length for each stack."""
    if config.task == "span_corruption":
        return (config.max_length, span_corruption.lengths(
            config.max_length, config.data.noise_density,
            config.data.mean_noise_span_length)[1])
    return (config.max_length,) * (2 if cfg.num_encoder_layers else 1)


def weights_of(cfg) -> tuple[list[Weight], dict]:
    """(the estimate's weights, the abstract parameters) of a model config."""
    _, params, dims = state_lib.abstract_model(cfg)
    out = []
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        name = state_lib.path_name(path)
        d = tuple(dims[name])
        out.append(Weight(name.split("/")[0], weight_role(name, d, cfg.tie_embeddings), d,
                          int(np.prod(x.shape))))
    return out, params


def analytic_model(config, cfg, optimizer, devices: int, microbatches: int | None = None,
                   repeats: int | None = None) -> Model:
    """The estimate's view of a run config on ``devices`` devices; a pipelined candidate's
    micro-batches (0: 4 x stages, or fewer as the batch allows) and rounds are ``microbatches``
    and ``repeats`` (None: the config's pipeline_microbatches and pipeline_repeats)."""
    weights, params = weights_of(cfg)
    opt = jax.eval_shape(optimizer.init, params)
    opt_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(opt)
                    if hasattr(x, "dtype"))
    param_bytes = sum(4 * w.elements for w in weights)
    batch = config.per_device_batch_size * devices
    accumulate = max(config.grad_accum_steps, 1)
    return Model(cfg, weights, stacks_of(cfg, run_lengths(config, cfg), batch // accumulate),
                 opt_bytes / param_bytes, bool(config.shard_optimizer_over_data), batch,
                 2 if cfg.dtype == "bfloat16" else 4, cfg.remat, accumulate,
                 tuple(scanned.groups(cfg).values()) if cfg.scan_layers else (),
                 config.get("pipeline_microbatches", 0) if microbatches is None
                 else microbatches,
                 config.get("pipeline_repeats", 1) if repeats is None else repeats)
