"""The shipped tasks, in T5's text-to-text formats (Raffel et al. 2020, appendix D) and with its
metrics: GLUE, SuperGLUE, SQuAD v1.1, XSum, CNN/DailyMail from prepared tfds directories, and the
movie-review sentences shipped with VADER (switchzoo.tasks.movie_reviews).

T5's GLUE format: the benchmark's name, then each input feature as ``name: value`` in sorted
name order (MultiRC and WiC in their own order), the label as its class name; a label of -1 (a
test split without answers) becomes ``<unk>``.
"""
from __future__ import annotations

import re

from switchzoo.tasks.task import Example, Task

_SKIP = {"label", "idx"}


def _label(classes, value) -> str:
    value = int(value)
    return "<unk>" if value < 0 else classes[value]


def glue_format(benchmark: str, classes, features=None):
    """T5's GLUE strings: ``features`` in that order, else the row's fields (not label, idx)
    in sorted name order."""
    def preprocess(row: dict) -> Example:
        names = features or sorted(k for k in row if k not in _SKIP and not k.startswith("_"))
        text = " ".join([benchmark] + [f"{k}: {row[k]}" for k in names])
        label = _label(classes, row["label"])
        return Example(text, (label,), label)
    return preprocess


def stsb(row: dict) -> Example:
    """T5's STS-B: the similarity (0-5) rounded to the nearest 0.2, written with one decimal."""
    target = f"{round(float(row['label']) * 5) / 5:.1f}"
    return Example(f"stsb sentence1: {row['sentence1']} sentence2: {row['sentence2']}",
                   (target,), float(row["label"]))


def multirc(row: dict) -> Example:
    ex = glue_format("multirc", ("False", "True"), ("question", "answer", "paragraph"))(row)
    idx = row.get("idx") or {}
    return Example(ex.inputs, ex.targets, ex.reference,
                   (idx.get("paragraph"), idx.get("question")))


def _mark(text: str, span: str, index: int, mark: str) -> str:
    """``mark span mark`` at word ``index`` of ``text`` (T5's _mark_span)."""
    words = text.split(" ")
    if words[index:index + len(span.split(" "))] != span.split(" "):
        return text.replace(span, f"{mark} {span} {mark}", 1)     # T5 leaves such rows as they are
    return " ".join(words[:index] + [mark] + words[index:index + len(span.split(" "))] + [mark]
                    + words[index + len(span.split(" ")):])


def wsc(row: dict) -> Example:
    """T5's WSC: the noun marked with * and the pronoun with #, the label False / True."""
    i1, i2 = int(row["span1_index"]), int(row["span2_index"])
    text = _mark(row["text"], row["span1_text"], i1, "*")
    text = _mark(text, row["span2_text"], i2 + 2 * (i1 < i2), "#")
    label = _label(("False", "True"), row["label"])
    return Example(f"wsc text: {text}", (label,), label)


def record(row: dict) -> Example:
    """T5's ReCoRD: query, the candidate entities and the passage (its @highlight lines joined
    as sentences); every answer is a training target, and the metric takes the best over them."""
    passage = re.sub(r"(\.|\?|\!|\"|\')\n@highlight\n", r"\1 ", row["passage"])
    passage = re.sub(r"\n@highlight\n", ". ", passage)
    entities = ", ".join(row["entities"])
    answers = tuple(row["answers"]) or ("<unk>",)
    return Example(f"record query: {row['query']} entities: {entities} passage: {passage}",
                   answers, answers)


def pad_punctuation(text: str) -> str:
    """T5's SQuAD text: a space around every character that is not a letter, digit, mark,
    underscore or space; runs of spaces made one."""
    return " ".join(re.sub(r"([^\w\s])", r" \1 ", text).split())


def squad(row: dict) -> Example:
    answers = tuple(pad_punctuation(a) for a in row["answers"]["text"]) or ("",)
    return Example(f"question: {pad_punctuation(row['question'])} context: "
                   f"{pad_punctuation(row['context'])}", answers[:1], answers)


def summarize(document: str, summary: str):
    def preprocess(row: dict) -> Example:
        return Example(f"summarize: {row[document]}", (row[summary],), row[summary])
    return preprocess


def movie_reviews(row: dict) -> Example:
    return Example(f"sentiment: {row['sentence']}", (row["label"],), row["label"])


def _glue(name, classes, metrics, columns, benchmark=None, tfds=None, splits=None):
    return Task(f"glue_{name}", f"tfds:glue/{tfds or name}",
                glue_format(benchmark or name, classes), metrics, classes,
                splits=splits or Task.splits, about=f"GLUE {name.upper()} (T5's format)",
                columns=columns)


NLI = ("entailment", "not_entailment")
TASKS = [
    _glue("cola", ("unacceptable", "acceptable"), ("matthews",), ("sentence",)),
    _glue("sst2", ("negative", "positive"), ("accuracy",), ("sentence",)),
    _glue("mrpc", ("not_equivalent", "equivalent"), ("f1", "accuracy"),
          ("sentence1", "sentence2")),
    _glue("qqp", ("not_duplicate", "duplicate"), ("f1", "accuracy"),
          ("question1", "question2")),
    _glue("mnli_matched", ("entailment", "neutral", "contradiction"), ("accuracy",),
          ("premise", "hypothesis"), benchmark="mnli", tfds="mnli", splits=(("train", "train"),
                                                 ("validation", "validation_matched"),
                                                 ("test", "test_matched"))),
    _glue("mnli_mismatched", ("entailment", "neutral", "contradiction"), ("accuracy",),
          ("premise", "hypothesis"), benchmark="mnli", tfds="mnli", splits=(("train", "train"),
                                                 ("validation", "validation_mismatched"),
                                                 ("test", "test_mismatched"))),
    _glue("qnli", NLI, ("accuracy",), ("question", "sentence")),
    _glue("rte", NLI, ("accuracy",), ("sentence1", "sentence2")),
    _glue("wnli", ("not_entailment", "entailment"), ("accuracy",), ("sentence1", "sentence2")),
    Task("glue_stsb", "tfds:glue/stsb", stsb, ("pearson", "spearman"), postprocess="float",
         about="GLUE STS-B, targets rounded to 0.2 (T5's format)",
         columns=("sentence1", "sentence2")),
    Task("super_glue_boolq", "tfds:super_glue/boolq",
         glue_format("boolq", ("False", "True")), ("accuracy",), ("False", "True"),
         columns=("question", "passage")),
    Task("super_glue_cb", "tfds:super_glue/cb",
         glue_format("cb", ("entailment", "contradiction", "neutral")), ("macro_f1", "accuracy"),
         ("entailment", "contradiction", "neutral"), columns=("premise", "hypothesis")),
    Task("super_glue_copa", "tfds:super_glue/copa",
         glue_format("copa", ("choice1", "choice2")), ("accuracy",), ("choice1", "choice2"),
         columns=("premise", "question", "choice1", "choice2")),
    Task("super_glue_multirc", "tfds:super_glue/multirc", multirc, ("multirc",),
         ("False", "True"), columns=("paragraph", "question", "answer")),
    Task("super_glue_record", "tfds:super_glue/record", record, ("squad",), postprocess="text",
         max_target_length=32, columns=("passage", "query", "entities")),
    Task("super_glue_rte", "tfds:super_glue/rte",
         glue_format("rte", NLI), ("accuracy",), NLI, columns=("premise", "hypothesis")),
    Task("super_glue_wic", "tfds:super_glue/wic",
         glue_format("wic", ("False", "True"), ("sentence1", "sentence2", "word")),
         ("accuracy",), ("False", "True"), columns=("sentence1", "sentence2", "word")),
    Task("super_glue_wsc", "tfds:super_glue/wsc.fixed", wsc, ("accuracy",), ("False", "True"),
         columns=("text", "span1_index", "span1_text", "span2_index", "span2_text")),
    Task("squad_v1", "tfds:squad/v1.1", squad, ("squad",), postprocess="text",
         max_target_length=32, reported="exact_match", columns=("question", "context"),
         splits=(("train", "train"), ("validation", "validation"))),
    Task("xsum", "tfds:xsum", summarize("document", "summary"), ("rouge",), postprocess="text",
         max_target_length=64, reported="rouge2", columns=("document",)),
    Task("cnn_dailymail", "tfds:cnn_dailymail", summarize("article", "highlights"), ("rouge",),
         postprocess="text", max_target_length=128, reported="rouge2", columns=("article",)),
    Task("movie_reviews", "dir:movie_reviews", movie_reviews, ("accuracy", "f1"),
         ("negative", "positive"), max_target_length=4, reported="accuracy",
         columns=("sentence",),
         about="Rotten Tomatoes sentences rated by 20+ people (VADER's ground truth), "
               "positive above +0.5, negative below -0.5 (python -m "
               "switchzoo.tasks.movie_reviews --out DIR)"),
]
# GLUE and SuperGLUE's members, each scored on its own (the benchmark averages of
# switchzoo.tasks.metrics.benchmark_average)
MIXTURES = {
    "glue": [t.name for t in TASKS if t.name.startswith("glue_")],
    "super_glue": [t.name for t in TASKS if t.name.startswith("super_glue_")],
}
