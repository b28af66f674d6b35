"""The downstream tasks' metrics, computed by the libraries people trust: scikit-learn
(accuracy, F1, Matthews), SciPy (Pearson, Spearman), rouge-score (ROUGE-1, 2, Lsum), sacrebleu
(BLEU); SQuAD's exact match and F1 with the official v1.1 script's normalisation. Every score is
on T5's scale, x100.

    scores = compute(["accuracy", "f1"], predictions, references, groups)

``predictions`` are post-processed values (a label string, a float, a text; None where the
model wrote something outside the task's label set: scored wrong, never dropped), ``references``
the gold values, and for the metrics over several references (``squad``, ``record``) a tuple of
the acceptable answers. ``groups`` (MultiRC's question of each answer) feed the per-group exact
match.
"""
from __future__ import annotations

import collections
import re
import string
from typing import Callable, Sequence

import numpy as np

INVALID = "<invalid>"     # an output outside the label set: a class of its own, never right


def _labels(values: Sequence) -> list:
    return [INVALID if v is None else v for v in values]


def accuracy(preds, refs, groups=None) -> dict:
    from sklearn.metrics import accuracy_score
    return {"accuracy": 100 * accuracy_score(_labels(refs), _labels(preds))}


def binary_f1(positive: str) -> Callable:
    def f1(preds, refs, groups=None) -> dict:
        from sklearn.metrics import f1_score
        # the positive class against everything else (the other label, or an invalid output)
        return {"f1": 100 * f1_score([r == positive for r in refs],
                                     [p == positive for p in preds], zero_division=0.0)}
    return f1


def macro_f1(classes: Sequence[str]) -> Callable:
    """The mean of the per-class F1 over the task's classes (T5's mean_multiclass_f1: CB)."""
    def f1(preds, refs, groups=None) -> dict:
        from sklearn.metrics import f1_score
        return {"macro_f1": 100 * f1_score(_labels(refs), _labels(preds), labels=list(classes),
                                           average="macro", zero_division=0.0)}
    return f1


def matthews(preds, refs, groups=None) -> dict:
    from sklearn.metrics import matthews_corrcoef
    return {"matthews_corr": 100 * matthews_corrcoef(_labels(refs), _labels(preds))}


def _floats(preds) -> np.ndarray:
    """T5's string_to_float: an output that is not a number counts as -1."""
    return np.array([-1.0 if p is None else float(p) for p in preds])


def pearson(preds, refs, groups=None) -> dict:
    from scipy.stats import pearsonr
    return {"pearson_corr": 100 * float(pearsonr(np.asarray(refs, float), _floats(preds))[0])}


def spearman(preds, refs, groups=None) -> dict:
    from scipy.stats import spearmanr
    return {"spearman_corr": 100 * float(spearmanr(np.asarray(refs, float),
                                                   _floats(preds))[0])}


# SQuAD v1.1's official evaluation script: lower case, no punctuation, no articles, one space.
def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _exact(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def _f1(prediction: str, truth: str) -> float:
    pred, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
    common = collections.Counter(pred) & collections.Counter(gold)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def squad(preds, refs, groups=None) -> dict:
    """Exact match and token F1, each the best over an example's gold answers (the official
    script's metric_max_over_ground_truths), averaged over examples."""
    em = [max(_exact(p or "", t) for t in truths) for p, truths in zip(preds, refs)]
    f1 = [max(_f1(p or "", t) for t in truths) for p, truths in zip(preds, refs)]
    return {"exact_match": 100 * float(np.mean(em)), "f1": 100 * float(np.mean(f1))}


def multirc(preds, refs, groups) -> dict:
    """MultiRC (T5's): F1 of the True class over all answers, and exact match per question
    (every answer of a question right), averaged over questions."""
    scores = binary_f1("True")(preds, refs)
    right = collections.defaultdict(list)
    for p, r, g in zip(preds, refs, groups):
        right[g].append(p == r)
    scores["exact_match"] = 100 * float(np.mean([all(v) for v in right.values()]))
    return scores


def rouge(preds, refs, groups=None) -> dict:
    """ROUGE-1, ROUGE-2 and ROUGE-Lsum F-measures (Porter stemming, as T5's rouge metric),
    averaged over examples (T5 reports the bootstrap median of that mean; the plain mean is
    exact and repeatable). Lsum reads one sentence per line, as the summaries are written."""
    from rouge_score import rouge_scorer
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeLsum"], use_stemmer=True)
    totals = collections.defaultdict(float)
    for p, r in zip(preds, refs):
        for k, s in scorer.score(r, p or "").items():
            totals[k] += s.fmeasure
    return {k: 100 * v / max(len(preds), 1) for k, v in totals.items()}


def bleu(preds, refs, groups=None) -> dict:
    import sacrebleu
    return {"bleu": sacrebleu.corpus_bleu([p or "" for p in preds], [list(refs)]).score}


# name -> a factory of the metric given the task's classes (None: a task without a label set)
METRICS: dict[str, Callable[[Sequence[str] | None], Callable]] = {
    "accuracy": lambda classes: accuracy,
    # the positive class is the label set's last (T5's order: not_equivalent / equivalent,
    # not_duplicate / duplicate, negative / positive, False / True)
    "f1": lambda classes: binary_f1(classes[-1]),
    "macro_f1": lambda classes: macro_f1(classes),
    "matthews": lambda classes: matthews,
    "pearson": lambda classes: pearson,
    "spearman": lambda classes: spearman,
    "squad": lambda classes: squad,
    "multirc": lambda classes: multirc,
    "rouge": lambda classes: rouge,
    "bleu": lambda classes: bleu,
}
NEEDS_CLASSES = ("f1", "macro_f1")
# the scores each metric reports (what finetune.best_metric may name)
SCORES = {"accuracy": ("accuracy",), "f1": ("f1",), "macro_f1": ("macro_f1",),
          "matthews": ("matthews_corr",), "pearson": ("pearson_corr",),
          "spearman": ("spearman_corr",), "squad": ("exact_match", "f1"),
          "multirc": ("f1", "exact_match"), "rouge": ("rouge1", "rouge2", "rougeLsum"),
          "bleu": ("bleu",)}


def check(names: Sequence[str], classes: Sequence[str] | None, where: str) -> None:
    """One line for an unknown metric, or a metric that needs the task's label set."""
    for name in names:
        if name not in METRICS:
            raise ValueError(f"{where}: unknown metric '{name}'; known: "
                             f"{', '.join(sorted(METRICS))}")
        if name in NEEDS_CLASSES and not classes:
            raise ValueError(f"{where}: metric '{name}' needs the task's labels (a label set, "
                             "e.g. --config.finetune.labels=negative,positive)")


def compute(names: Sequence[str], preds: Sequence, refs: Sequence, groups: Sequence | None = None,
            classes: Sequence[str] | None = None) -> dict:
    """{score name: value} of every metric in ``names`` (rounded to 1e-6)."""
    out = {}
    for name in names:
        out.update(METRICS[name](classes)(list(preds), list(refs), groups))
    return {k: round(float(v), 6) for k, v in out.items()}


def task_score(scores: dict) -> float:
    """A task's one number for a benchmark average: the mean of its scores (GLUE's rule for a
    task with two metrics: MRPC and QQP average F1 and accuracy, STS-B Pearson and Spearman)."""
    return float(np.mean(list(scores.values())))


def benchmark_average(per_task: dict[str, dict]) -> float:
    """GLUE / SuperGLUE's average: each task's score (task_score) averaged over the tasks, MNLI's
    matched and mismatched averaged into one task first (the GLUE paper's rule)."""
    scores = {name: task_score(s) for name, s in per_task.items()}
    mnli = [scores.pop(k) for k in ("glue_mnli_matched", "glue_mnli_mismatched") if k in scores]
    if mnli:
        scores["glue_mnli"] = float(np.mean(mnli))
    return float(np.mean(list(scores.values())))
