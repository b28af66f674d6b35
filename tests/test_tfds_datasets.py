"""The tfds reading path end to end for the papers' datasets: c4/en (span corruption),
wmt14_translate/de-en (translation) and lm1b (language modelling) train a few steps and evaluate.

Why directories written here, and not mock_data or TensorFlow: a run reads a *prepared*
dataset, DATA_DIR/NAME/VERSION with dataset_info.json and array_record shards, and never runs
the builder's code (switchzoo.data.sources reads it with tfds.builder_from_directory, which is
also how a user reads c4 or wmt14 prepared on another machine). So each test prepares a tiny
dataset with a builder of the real one's name, config, version, feature layout and splits (C4:
text / timestamp / url; WMT'14: a Translation feature de, en; LM1B: text) through tfds's own
array_record writer, and the run reads those files exactly as it would read the real ones.
mock_data would bypass the files (it patches the reading itself), and TensorFlow in the test
extra would add ~600 MB for builders whose generation code (downloads) cannot run offline.
"""
import json

import pytest
import tensorflow_datasets as tfds

from switchzoo import evaluate, loop
from switchzoo.configs import base
from switchzoo.data import embedded

PAIRS = embedded.shipped("de")[:260]


class C4(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version("3.1.0")
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="en")]

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"text": tfds.features.Text(), "timestamp": tfds.features.Text(),
             "url": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
        # documents: several messages joined, as web pages hold several sentences
        docs = [" ".join(e for e, _ in PAIRS[i:i + 5]) for i in range(0, len(PAIRS), 5)]
        return {"train": self._generate_examples(docs[:-8]),
                "validation": self._generate_examples(docs[-8:])}

    def _generate_examples(self, docs):
        for i, text in enumerate(docs):
            yield i, {"text": text, "timestamp": "2019-04-25T12:00:00Z",
                      "url": f"https://example.org/{i}"}


class Wmt14Translate(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="de-en")]

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self, features=tfds.features.Translation(languages=("de", "en")))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(PAIRS[:240]),
                "validation": self._generate_examples(PAIRS[240:250]),
                "test": self._generate_examples(PAIRS[250:])}

    def _generate_examples(self, pairs):
        for i, (en, de) in enumerate(pairs):
            yield i, {"en": en, "de": de}


class Lm1b(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version("1.1.0")

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):   # lm1b has train and test only
        return {"train": self._generate_examples(PAIRS[:240]),
                "test": self._generate_examples(PAIRS[240:])}

    def _generate_examples(self, pairs):
        for i, (en, _) in enumerate(pairs):
            yield i, {"text": en}


# The catalogue's smallest dense models: the reading path is the subject, and a dense step
# compiles in about half the time of a Switch one (Switch runs: tests/test_end_to_end.py).
CASES = {   # tfds name: (builder, config, task, model, the split evaluation must read)
    "c4/en": (C4, "en", "span_corruption", "t5_tiny", "validation"),
    "wmt14_translate/de-en": (Wmt14Translate, "de-en", "translation", "t5_tiny", "validation"),
    "lm1b": (Lm1b, None, "lm", "mtf_lm1b_tiny", "test"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_prepared_dataset_trains_and_evaluates(name, tmp_path):
    builder_cls, config_name, task, model, split = CASES[name]
    data_dir = tmp_path / "tfds"
    kwargs = {"config": config_name} if config_name else {}
    builder_cls(data_dir=str(data_dir), file_format="array_record", **kwargs
                ).download_and_prepare()
    assert list(data_dir.glob(f"{name}/*/*.array_record*"))
    c = base.get_base()
    c.model, c.task, c.num_train_steps = model, task, 3
    c.layout, c.mesh = "data_parallel", ""      # the reading path is the subject here
    c.per_device_batch_size, c.max_length = 1, 32
    c.log_every_steps = c.checkpoint_every_steps = 3
    c.eval_every_steps, c.warmup_steps = 0, 2
    c.data.source, c.data.tfds_data_dir = "tfds", str(data_dir)   # tfds_name "": the default
    c.data.vocab_size = 300
    if task == "translation":
        c.data.pair = "en-de"
        c.eval.max_examples, c.eval.num_beams, c.eval.max_decode_length = 4, 1, 6
    lines = []
    loop.train(c, tmp_path / "run", print_fn=lines.append)
    assert lines[0].startswith(f"data: tfds {name} (train; evaluation: {split})")
    results = evaluate.run(c, tmp_path / "run", print_fn=lambda *_: None)
    assert results["step"] == 3 and results["split"] == split
    assert results["neg_log_perplexity"] == -results["loss"] and 0 <= results["accuracy"] <= 1
    assert (results["bleu"] is not None) == (task == "translation")
    assert (results["word_perplexity"] is not None) == (task == "lm")
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["loss"] == results["loss"]
