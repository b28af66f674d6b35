"""What a downstream task is: where its examples come from, how an example becomes T5's
text-to-text strings, how the model's output string becomes a value, and which metrics score it.

    Example(inputs="sst2 sentence: a gem", targets=("positive",), reference="positive")

``targets[0]`` is what the model is trained to write (ReCoRD trains on every answer: one pair
each); ``reference`` is what the metrics compare with (a label, a number, a tuple of acceptable
answers, a summary); ``group`` joins the examples a per-group metric reads (MultiRC's question).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from switchzoo.tasks import metrics as metrics_lib

POSTPROCESSORS = ("label", "float", "text")


@dataclasses.dataclass(frozen=True)
class Example:
    inputs: str
    targets: tuple[str, ...]
    reference: Any
    group: Any = None


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    source: str                         # "tfds:glue/sst2", "dir:movie_reviews", "files"
    preprocess: Callable[[dict], Example]
    metrics: tuple[str, ...]
    classes: tuple[str, ...] | None = None   # the label set ("label" postprocessing)
    postprocess: str = "label"               # label | float | text
    splits: tuple[tuple[str, str], ...] = (("train", "train"), ("validation", "validation"),
                                           ("test", "test"))   # ours -> the source's
    max_target_length: int = 8               # decoding budget, in tokens
    about: str = ""
    reported: str = ""      # the score the Switch paper reports ("": the mean of the task's)
    columns: tuple[str, ...] = ()      # the input columns an example is made of

    def split(self, name: str) -> str:
        return dict(self.splits).get(name, name)

    def postprocess_output(self, text: str):
        """The value of an output string; None where it is outside the label set (or, for a
        number, not one): counted in the results and scored wrong."""
        text = text.strip()
        if self.postprocess == "label":
            return text if text in (self.classes or ()) else None
        if self.postprocess == "float":
            try:
                return float(text)
            except ValueError:
                return None
        return text

    def score(self, outputs: Sequence[str], examples: Sequence[Example]) -> dict:
        """The task's metrics of ``outputs`` (one string per example), with how many outputs
        fell outside the label set."""
        values = [self.postprocess_output(o) for o in outputs]
        refs = [e.reference for e in examples]
        groups = [e.group for e in examples]
        scores = metrics_lib.compute(self.metrics, values, refs, groups, self.classes)
        if self.postprocess != "text":
            scores["invalid_outputs"] = sum(v is None for v in values)
        scores["examples"] = len(examples)
        return scores

    def paper_score(self, scores: dict) -> float:
        """The task's number in a paper's table (Switch Table 5: SQuAD exact match, XSum and
        CNNDM ROUGE-2; a GLUE task the mean of its metrics)."""
        return scores[self.reported] if self.reported else self.headline(scores)

    def headline(self, scores: dict) -> float:
        """The one number the best checkpoint is chosen by: the mean of the task's scores
        (its only score for most tasks)."""
        keys = [k for k in scores if k not in ("invalid_outputs", "examples")]
        return round(sum(scores[k] for k in keys) / len(keys), 6)
