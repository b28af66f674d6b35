"""Every setting of a run config honoured or refused, before anything is written.

``check(config)`` raises ValueError with one line that names the field, the value and what is
allowed: counts and rates out of range, unknown choices, and fields the run would not read (a
data field of another source, weight decay under Adafactor, beam settings of a language model),
each compared with the default of configs/base.py, so that a value the user set is never
silently ignored.
"""
from __future__ import annotations

import math

from switchzoo.configs import base

INF = math.inf
# field: (lowest, highest, whether the bounds themselves are allowed (low, high), meaning)
RANGES = {
    "seed": (0, INF, (True, True), ""),
    "num_train_steps": (1, INF, (True, True), ""),
    "log_every_steps": (1, INF, (True, True), ""),
    "eval_every_steps": (0, INF, (True, True), " (0: never)"),
    "checkpoint_every_steps": (1, INF, (True, True), ""),
    "keep_checkpoints": (1, INF, (True, True), ""),
    "per_device_batch_size": (1, INF, (True, True), ""),
    "max_length": (2, INF, (True, True), " (one token + EOS)"),
    "grad_accum_steps": (1, INF, (True, True), ""),
    "warmup_steps": (0, INF, (True, True), ""),
    "learning_rate": (0, INF, (False, True), ""),
    "weight_decay": (0, INF, (True, True), ""),
    "label_smoothing": (0, 1, (True, False), ""),
    "dropout": (0, 1, (True, False), ""),
    "data.vocab_size": (32, INF, (True, True), ""),
    "data.spm_max_sentences": (1, INF, (True, True), ""),
    "data.max_eval_examples": (0, INF, (True, True), " (0: all)"),
    "data.embedded_max_pairs": (0, INF, (True, True), " (0: all)"),
    "eval.num_beams": (1, INF, (True, True), " (1: greedy)"),
    "eval.length_penalty": (0, INF, (True, True), ""),
    "eval.max_decode_length": (1, INF, (True, True), ""),
    "eval.max_examples": (1, INF, (True, True), ""),
    "moe.top_k": (1, INF, (True, True), ""),
    "moe.train_capacity_factor": (0, INF, (False, True), ""),
    "moe.eval_capacity_factor": (0, INF, (False, True), ""),
    "moe.group_size": (0, INF, (True, True), " (0: one group per sequence)"),
    "moe.block_size": (1, INF, (True, True), ""),
    "moe.aux_loss_weight": (0, INF, (True, True), ""),
    "moe.z_loss_weight": (0, INF, (True, True), ""),
    "moe.jitter": (0, 1, (True, False), ""),
    "moe.expert_dropout": (0, 1, (True, False), ""),
}
CHOICES = {
    "task": ("translation", "lm"),
    "optimizer": ("adamw", "adafactor"),
    "dtype": ("float32", "bfloat16"),
    "data.source": ("embedded", "files", "tfds"),
    "moe.dispatch": ("auto", "einsum", "dropless"),
    "moe.grouped_matmul": ("auto", "blocks", "ragged_dot"),
}
# field: (reads it?, who reads it) -- a field set away from its default where nothing reads it
# is refused. Evaluation reads data.eval_files whatever the source (switchzoo.evaluate).
_SOURCES = {"train_files": ("files",), "eval_files": ("files",), "tfds_name": ("tfds",),
            "tfds_data_dir": ("tfds",), "train_split": ("tfds",), "eval_split": ("tfds",),
            "pair": ("embedded", "tfds"), "embedded_max_pairs": ("embedded",),
            "locale_dir": ("embedded",)}
READERS = {
    **{f"data.{k}": (lambda c, s=s: c.data.source in s,
                     "data.source=" + " or ".join(s)) for k, s in _SOURCES.items()},
    "weight_decay": (lambda c: c.optimizer == "adamw", "optimizer=adamw"),
    **{f"eval.{k}": (lambda c: c.task == "translation", "task=translation (BLEU decoding)")
       for k in ("num_beams", "length_penalty", "max_decode_length", "max_examples")},
}


def get(config, dotted: str):
    node = config
    for part in dotted.split("."):
        node = node[part]
    return node


def _range_text(low, high, inclusive) -> str:
    left = f">= {low}" if inclusive[0] else f"> {low}"
    return left if high == INF else f"{left} and {'<=' if inclusive[1] else '<'} {high}"


def check(config, evaluating: bool = False) -> None:
    """Raises ValueError on the first setting that is out of range, unknown or unread."""
    for field, (low, high, inclusive, meaning) in RANGES.items():
        value = get(config, field)
        if value is None:                        # a moe.* placeholder: the catalogue's value
            continue
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and (value >= low if inclusive[0] else value > low)
              and (value <= high if inclusive[1] else value < high))
        if not ok:
            raise ValueError(f"--config.{field}={value!r} is out of range: it must be "
                             f"{_range_text(low, high, inclusive)}{meaning}")
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
            if not (evaluating and field == "data.eval_files")
            and get(config, field) != get(defaults, field) and not reads(config)]


def _context(config, who: str) -> str:
    field = who.split("=")[0]
    return f"{field}={get(config, field)}"
