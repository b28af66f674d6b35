"""Every setting of a run config honoured or refused, before anything is written.

``check(config)`` raises ValueError with one line that names the field, the value and what is
allowed: counts and rates out of range, unknown choices, and fields the run would not read (a
data field of another source, weight decay under Adafactor, beam settings of a language model),
each compared with the default of configs/base.py, so that a value the user set is never
silently ignored.
"""
from __future__ import annotations

import dataclasses
import math
import re

from switchzoo.config import (ATTENTION, BALANCE, INIT_DISTRIBUTIONS, LOSS_REDUCTIONS, REMAT,
                              ROUTERS)
from switchzoo import layout as layout_lib
from switchzoo.configs import base

@dataclasses.dataclass(frozen=True)
class Range:
    low: float
    high: float = math.inf
    open_low: bool = False          # the bound itself is not allowed
    open_high: bool = False
    meaning: str = ""

    def holds(self, value) -> bool:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and (value > self.low if self.open_low else value >= self.low)
                and (value < self.high if self.open_high else value <= self.high))

    def __str__(self) -> str:
        text = f"{'>' if self.open_low else '>='} {self.low}"
        if self.high != math.inf:
            text += f" and {'<' if self.open_high else '<='} {self.high}"
        return text + self.meaning


def at_least(low: int, meaning: str = "") -> Range:
    return Range(low, meaning=meaning)


SCHEDULES = ("rsqrt", "linear_rsqrt", "constant")      # switchzoo.state.SCHEDULES
POSITIVE = Range(0, open_low=True)
FRACTION = Range(0, 1, open_high=True)      # rates: dropout, smoothing, jitter
RANGES = {
    "seed": at_least(0),
    "num_train_steps": at_least(1),
    "log_every_steps": at_least(1),
    "eval_every_steps": at_least(0, " (0: never)"),
    "checkpoint_every_steps": at_least(1),
    "keep_checkpoints": at_least(1),
    "restore_step": at_least(1, " (a checkpoint's step; unset: the newest)"),
    "per_device_batch_size": at_least(1),
    "max_length": at_least(2, " (one token + EOS)"),
    "grad_accum_steps": at_least(1),
    "warmup_steps": at_least(0),
    "learning_rate": POSITIVE,
    "init_scale": POSITIVE,
    "router_learning_rate_scale": POSITIVE,
    "router_freeze_step": at_least(0, " (0: never)"),
    "momentum": FRACTION,
    "expert_momentum": FRACTION,
    "weight_decay": at_least(0),
    "label_smoothing": FRACTION,
    "loss_chunk": at_least(0, " (0: the full-logits loss)"),
    "dropout": FRACTION,
    "data.vocab_size": at_least(32),
    "data.spm_max_sentences": at_least(1),
    "data.max_eval_examples": at_least(0, " (0: all)"),
    "data.embedded_max_pairs": at_least(0, " (0: all)"),
    "data.prefetch": at_least(0, " (0: no read-ahead)"),
    "data.input_shards": at_least(0, " (0: one per batch shard of the run's first mesh)"),
    "data.noise_density": Range(0, 1, open_low=True, open_high=True),
    "data.mean_noise_span_length": at_least(1),
    "eval.num_beams": at_least(1, " (1: greedy)"),
    "eval.length_penalty": at_least(0),
    "eval.max_decode_length": at_least(1),
    "eval.max_examples": at_least(0, " (0: no translations, perplexity only)"),
    "moe.top_k": at_least(1),
    "moe.train_capacity_factor": POSITIVE,
    "moe.eval_capacity_factor": POSITIVE,
    "moe.group_size": at_least(0, " (0: one group per sequence)"),
    "moe.block_size": at_least(1),
    "moe.aux_loss_weight": at_least(0),
    "moe.z_loss_weight": at_least(0),
    "moe.jitter": FRACTION,
    "moe.expert_dropout": FRACTION,
    "moe.bias_rate": at_least(0),
    "distill.weight": Range(0, 1),
    "moe.num_shared_experts": at_least(0),
    "pipeline_microbatches": at_least(0, " (0: one per stage)"),
    "pipeline_repeats": at_least(1, " (1: GPipe)"),
    "finetune.target_length": at_least(0, " (0: max_length)"),
    "finetune.mixture_cap": at_least(0, " (0: no cap)"),
    "finetune.expert_dropout": FRACTION,
}
CHOICES = {
    "task": ("translation", "lm", "span_corruption", "text2text"),
    "optimizer": ("adamw", "adafactor"),
    "moments_dtype": ("float32", "bfloat16"),
    "dtype": ("float32", "bfloat16"),
    "remat": REMAT,
    "attention": ATTENTION,
    "data.source": ("embedded", "files", "tfds"),
    "moe.dispatch": ("auto", "einsum", "dropless", "index"),
    "moe.eval_groups": ("sequence", "train"),
    "moe.grouped_matmul": ("auto", "blocks", "ragged_dot"),
    "moe.router": ROUTERS,
    "moe.balance": BALANCE,
    "moe.loss_reduction": LOSS_REDUCTIONS,
    "schedule": SCHEDULES,
    "init_distribution": INIT_DISTRIBUTIONS,
}


def _pipelined(config) -> bool:
    """Whether the run's layout splits 'layers' over a mesh axis (a pipeline)."""
    try:
        text = layout_lib.layout_string(config.layout)
    except layout_lib.LayoutError:
        return False                      # run_layout refuses it in its own words
    return any(e.strip().startswith("layers:") for e in text.split(","))


# field: (reads it?, who reads it) -- a field set away from its default where nothing reads it
# is refused.
_SOURCES = {"train_files": ("files",), "eval_files": ("files",), "tfds_name": ("tfds",),
            "train_split": ("tfds",), "eval_split": ("tfds",),
            "pair": ("embedded", "tfds"), "embedded_max_pairs": ("embedded",),
            "locale_dir": ("embedded",)}
READERS = {
    **{f"data.{k}": (lambda c, s=s: c.data.source in s,
                     "data.source=" + " or ".join(s)) for k, s in _SOURCES.items()},
    "data.tfds_data_dir": (lambda c: c.data.source == "tfds" or c.task == "text2text",
                           "data.source=tfds or task=text2text"),
    **{f"data.{k}": (lambda c: c.task == "span_corruption", "task=span_corruption")
       for k in ("noise_density", "mean_noise_span_length")},
    **{f"finetune.{k}": (lambda c: c.task == "text2text", "task=text2text")
       for k in ("task", "data_dir", "eval_split", "best_metric", "target_length",
                 "mixture_cap", "expert_dropout")},
    **{f"finetune.{k}": (lambda c: c.task == "text2text" and c.finetune.task == "files",
                         "task=text2text and finetune.task=files")
       for k in ("train_files", "eval_files", "inputs", "targets", "labels", "metrics")},
    # a fine-tune reads its examples from its task (finetune.*), never from data.source
    "data.source": (lambda c: c.task != "text2text", "task=translation, lm or span_corruption"),
    "data.info_dir": (lambda c: c.task == "span_corruption" and c.data.source == "embedded",
                      "task=span_corruption and data.source=embedded"),
    **{k: (lambda c: c.optimizer == "adamw", "optimizer=adamw")
       for k in ("weight_decay", "moments_dtype")},
    "warmup_steps": (lambda c: c.schedule != "constant", "schedule=rsqrt or linear_rsqrt"),
    "distill.weight": (lambda c: bool(c.distill.teacher), "distill.teacher=DIR"),
    "loss_chunk": (lambda c: not c.distill.teacher,
                   "distill.teacher='' (distillation keeps the full logits)"),
    "moe.bias_rate": (lambda c: c.moe.balance == "bias", "moe.balance=bias"),
    "moe.noncausal_decoder": (lambda c: c.moe.router == "experts_choose",
                              "moe.router=experts_choose"),
    "moe.aux_loss_weight": (lambda c: c.moe.balance != "bias",
                            "moe.balance=aux_loss (bias balancing trains without it)"),
    **{k: (_pipelined, "a layout with 'layers:stage' (and stage:N in the mesh)")
       for k in ("pipeline_microbatches", "pipeline_repeats")},
    **{f"eval.{k}": (lambda c: c.task == "translation", "task=translation (BLEU decoding)")
       for k in ("num_beams", "length_penalty", "max_decode_length", "max_examples")},
}


def get(config, dotted: str):
    node = config
    for part in dotted.split("."):
        node = node[part]
    return node


# Evaluation reads data.eval_files whatever the source; it may evaluate a pipelined run on a
# mesh without a stage axis (the run's pipeline fields then rest unread).
EVAL_MAY_SET = ("data.eval_files", "pipeline_microbatches", "pipeline_repeats")


def check(config, evaluating: bool = False) -> None:
    """Raises ValueError on the first setting that is out of range, unknown or unread."""
    for field, allowed in RANGES.items():
        value = get(config, field)
        if value is not None and not allowed.holds(value):   # None: the catalogue's moe value
            raise ValueError(f"--config.{field}={value!r} is out of range: it must be {allowed}")
    for field, allowed in CHOICES.items():
        value = get(config, field)
        if value is not None and value not in allowed:
            raise ValueError(f"--config.{field}={value!r} is not one of {', '.join(allowed)}")
    defaults = base.get_base()
    for field in unread(config, evaluating):
        who = READERS[field][1]
        raise ValueError(f"--config.{field}={get(config, field)!r} is read only with {who}, and "
                         f"this run has {_context(config, who)}: set that, or leave {field} at "
                         f"its default ({get(defaults, field)!r})")


def unread(config, evaluating: bool = False) -> list[str]:
    """The fields of READERS set away from their defaults where this run does not read them."""
    defaults = base.get_base()
    return [field for field, (reads, _) in READERS.items()
            if not (evaluating and field in EVAL_MAY_SET)
            and get(config, field) != get(defaults, field) and not reads(config)]


def _context(config, who: str) -> str:
    fields = re.findall(r"([\w.]+)=", who)
    def value(field):           # None: a moe field left to the model's own setting
        v = get(config, field)
        return "the model's own" if v is None else v
    return " and ".join(f"{field}={value(field)}" for field in fields)
