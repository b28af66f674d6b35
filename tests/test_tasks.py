"""The task registry: T5's text-to-text formats, the sources (prepared tfds directories read
without builder code, TSV / JSONL / Parquet files), the movie-review task built from a
source distribution of VADER's layout, and the one-line refusals."""
import io
import json
import pathlib
import tarfile

import numpy as np
import pytest
import tensorflow_datasets as tfds

from switchzoo import tasks
from switchzoo.configs import base
from switchzoo.tasks import catalogue, movie_reviews


def config(**finetune):
    c = base.get_base()
    c.task = "text2text"
    for k, v in finetune.items():
        c.finetune[k] = v
    return c


def test_glue_formats_are_t5s():
    sst2 = tasks.get("glue_sst2").preprocess({"sentence": "a gem", "label": 1, "idx": 3})
    assert (sst2.inputs, sst2.targets) == ("sst2 sentence: a gem", ("positive",))
    mnli = tasks.get("glue_mnli_matched").preprocess(
        {"premise": "P.", "hypothesis": "H.", "label": 2, "idx": 0})
    assert (mnli.inputs, mnli.reference) == ("mnli hypothesis: H. premise: P.", "contradiction")
    assert tasks.get("glue_sst2").preprocess({"sentence": "x", "label": -1}).targets == ("<unk>",)
    stsb = tasks.get("glue_stsb").preprocess({"sentence1": "a", "sentence2": "b", "label": 3.14})
    assert (stsb.targets, stsb.reference) == (("3.2",), 3.14)       # nearest 0.2
    wic = tasks.get("super_glue_wic").preprocess(
        {"sentence1": "s1", "sentence2": "s2", "word": "w", "label": 0, "start1": 0})
    assert wic.inputs == "wic sentence1: s1 sentence2: s2 word: w"


def test_wsc_record_and_squad_formats():
    wsc = catalogue.wsc({"text": "Mark told Pete he was late", "span1_index": 0,
                         "span1_text": "Mark", "span2_index": 3, "span2_text": "he", "label": 1})
    assert wsc.inputs == "wsc text: * Mark * told Pete # he # was late"
    rec = catalogue.record({"query": "@placeholder won", "entities": ["A", "B"],
                            "passage": "Story.\n@highlight\nA won\n@highlight\nB lost",
                            "answers": ["A", "A."]})
    assert rec.inputs == "record query: @placeholder won entities: A, B passage: Story. A won. B lost"
    assert rec.targets == ("A", "A.")            # every answer trains; the best one scores
    sq = catalogue.squad({"question": "Who?", "context": "U.S. law",
                          "answers": {"text": ["U.S."], "answer_start": [0]}})
    assert (sq.inputs, sq.targets) == ("question: Who ? context: U . S . law", ("U . S .",))


def test_outputs_outside_the_label_set_are_counted_and_wrong():
    task = tasks.get("movie_reviews")
    examples = [task.preprocess({"sentence": s, "label": lab}) for s, lab in
                (("fine", "positive"), ("dull", "negative"), ("meh", "negative"))]
    scores = task.score(["positive", "neutral", " negative "], examples)
    assert scores["invalid_outputs"] == 1 and scores["accuracy"] == pytest.approx(200 / 3)


def write_rows(path: pathlib.Path, rows: list[dict]):
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        keys = list(rows[0])
        path.write_text("\t".join(keys) + "\n" + "".join(
            "\t".join(str(r[k]) for k in keys) + "\n" for r in rows))


@pytest.mark.parametrize("suffix", [".tsv", ".jsonl", ".parquet"])
def test_your_own_task_from_files(suffix, tmp_path):
    rows = [{"text": "great film", "label": 1}, {"text": "bad film", "label": 0}]
    write_rows(tmp_path / f"train{suffix}", rows)
    c = config(task="files", train_files=str(tmp_path / f"train{suffix}"),
               eval_files=str(tmp_path / f"train{suffix}"), inputs="review: {text}",
               targets="{label}", labels="negative,positive", metrics="accuracy,f1")
    (task,) = tasks.resolve(c.finetune)
    got = tasks.examples(task, "train", c)
    # an integer label (JSONL, Parquet) is the label of that index; TSV holds the text "1"
    want = ("positive" if suffix != ".tsv" else "1")
    assert (got[0].inputs, got[0].targets[0]) == ("review: great film", want)


def test_a_missing_column_names_file_and_line(tmp_path):
    write_rows(tmp_path / "t.jsonl", [{"text": "a", "label": 0}, {"txt": "b", "label": 1}])
    c = config(task="files", train_files=str(tmp_path / "t.jsonl"), inputs="{text}",
               targets="{label}", labels="no,yes", metrics="accuracy")
    (task,) = tasks.resolve(c.finetune)
    with pytest.raises(ValueError, match=r"t.jsonl:2: no column 'text' \(it has txt, label\)"):
        tasks.examples(task, "train", c)


def test_unknown_task_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown task 'sst3'; known: .*glue_sst2.*movie_reviews"):
        tasks.resolve(config(task="sst3").finetune)


class Glue(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """glue/sst2's and glue/cola's name, version, features and splits, a few rows."""
    VERSION = tfds.core.Version("2.0.0")
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="sst2"), tfds.core.BuilderConfig(name="cola")]

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"sentence": tfds.features.Text(), "label": tfds.features.ClassLabel(num_classes=2),
             "idx": tfds.features.Scalar(dtype=np.int32)}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(["a gem", "a mess"]),
                "validation": self._generate_examples(["fine"])}

    def _generate_examples(self, texts):
        for i, t in enumerate(texts):
            yield i, {"sentence": t, "label": i % 2, "idx": i}


def test_a_prepared_tfds_directory_is_read_without_its_builder(tmp_path):
    Glue(data_dir=str(tmp_path), config="sst2", file_format="array_record").download_and_prepare()
    c = config(task="glue_sst2")
    c.data.tfds_data_dir = str(tmp_path)
    got = tasks.examples(tasks.get("glue_sst2"), "train", c)
    assert sorted((e.inputs, e.reference) for e in got) == [
        ("sst2 sentence: a gem", "negative"), ("sst2 sentence: a mess", "positive")]
    missing = config(task="super_glue_boolq")
    missing.data.tfds_data_dir = str(tmp_path)
    with pytest.raises(ValueError, match="'super_glue/boolq' is not prepared in .*tfds build "
                                         "super_glue/boolq --file_format=array_record"):
        tasks.examples(tasks.get("super_glue_boolq"), "train", missing)


def vader_sdist(path: pathlib.Path, lines: list[str]) -> pathlib.Path:
    """A source distribution laid out as vaderSentiment-3.3.2.tar.gz is."""
    def add(tar, name, blob):
        info = tarfile.TarInfo(name)
        info.size = len(blob)
        tar.addfile(info, io.BytesIO(blob))
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w:gz") as tar:
        add(tar, "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt",
            "\r\n".join(lines).encode())
    with tarfile.open(path, "w:gz") as tar:
        add(tar, f"vaderSentiment-3.3.2/{movie_reviews.INNER}", inner.getvalue())
    return path


def test_movie_reviews_labels_thresholds_and_splits(tmp_path):
    lines = [f"{i}\t{r}\tsentence number {i} here" for i, r in
             enumerate([2.5, -1.2, 0.5, -0.5, 0.51, -3.0] * 10)]
    rows = movie_reviews.ground_truth(vader_sdist(tmp_path / "v.tar.gz", lines), check=False)
    counts = movie_reviews.build(rows, tmp_path / "out")
    assert counts["left_out_within_threshold"] == 20           # +-0.5 itself is left out
    assert sum(counts[s]["examples"] for s in movie_reviews.SPLITS) == 40
    test = (tmp_path / "out" / "test.tsv").read_text().splitlines()
    assert test[0] == "sentence\trating\tlabel"
    for line in test[1:]:
        sentence, rating, label = line.split("\t")
        assert movie_reviews.split_of(sentence) == "test"
        assert label == ("positive" if float(rating) > 0.5 else "negative")
    with pytest.raises(ValueError, match="sha256 .* is not vaderSentiment-3.3.2's"):
        movie_reviews.ground_truth(tmp_path / "v.tar.gz")


def test_a_mixture_trains_on_every_member_capped_and_scores_each(tmp_path):
    from switchzoo import data
    for name in ("sst2", "cola"):
        Glue(data_dir=str(tmp_path), config=name,
             file_format="array_record").download_and_prepare()
    c = config(task="glue_sst2+glue_cola", mixture_cap=1)
    c.data.tfds_data_dir = str(tmp_path)
    corpus, held = data.finetune_corpus(c, evaluating=False)
    assert sorted(p[0].split()[0] for p in corpus.train) == ["cola", "sst2"]   # one pair each
    assert {t.name: [e.inputs for e in ex] for t, ex in held.items()} == {
        "glue_sst2": ["sst2 sentence: fine"], "glue_cola": ["cola sentence: fine"]}
    assert tasks.resolve(config(task="glue").finetune)[0].name == "glue_cola"


def test_your_inputs_become_the_tasks_strings():
    from switchzoo import predict
    c = config(task="glue_sst2")
    assert predict.task_inputs(tasks.get("glue_sst2"), ["a gem"], "in", c) == [
        "sst2 sentence: a gem"]
    assert predict.task_inputs(tasks.get("glue_mnli_matched"),
                               ['{"premise": "P.", "hypothesis": "H."}'], "in", c) == [
        "mnli hypothesis: H. premise: P."]
    with pytest.raises(ValueError, match=r"in:1: task glue_mnli_matched reads several columns "
                                         r"\(premise, hypothesis\); write each input as a JSON"):
        predict.task_inputs(tasks.get("glue_mnli_matched"), ["plain"], "in", c)


def test_the_best_metric_must_be_a_score_of_the_task():
    tasks.check_best_metric([tasks.get("squad_v1")], "exact_match")
    with pytest.raises(ValueError, match=r"best_metric='accuracy' is not a score of task "
                                         r"squad_v1 \(it reports exact_match, f1\)"):
        tasks.check_best_metric([tasks.get("squad_v1")], "accuracy")
    from switchzoo.tasks import metrics as metrics_lib
    cases = {"squad": (["yes", "no"], [("yes",), ("no",)]),
             "pearson": (["1", "3", "2"], [1.0, 2.0, 3.0]),
             "spearman": (["1", "3", "2"], [1.0, 2.0, 3.0])}
    for name, scores in metrics_lib.SCORES.items():      # the table says what compute gives
        preds, refs = cases.get(name, (["yes", "no"], ["yes", "yes"]))
        got = metrics_lib.compute([name], preds, refs, ["q", "q"][:len(refs)] + ["r"],
                                  ("no", "yes"))
        assert set(got) == set(scores), name
