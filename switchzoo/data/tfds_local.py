"""A TensorFlow Datasets builder over local files, so a run can use the tfds path offline.

    prepare("translation", "train.tsv", "dev.tsv", data_dir)   # -> local_text/translation
    --config.data.source=tfds --config.data.tfds_name=local_text/translation \
        --config.data.tfds_data_dir=DATA_DIR

It is a real ``GeneratorBasedBuilder``: prepared as array_record (no TensorFlow needed) and read
back with ``tfds.data_source`` like wmt14_translate or lm1b. Splits: train, validation.
"""
from __future__ import annotations

import tensorflow_datasets as tfds

from switchzoo.data import files

NAME = "local_text"


class LocalText(tfds.core.GeneratorBasedBuilder):
    """Translation pairs (features source, target) or LM texts (feature text) from local files."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "TSV / text lines, gzip allowed."}
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="translation", description="source<TAB>target"),
                       tfds.core.BuilderConfig(name="lm", description="one text per line")]

    def __init__(self, *, train_files: str = "", eval_files: str = "", **kwargs):
        # Only preparing needs the files; reading a prepared dataset needs none.
        self._files = {"train": train_files, "validation": eval_files}
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        if self.builder_config.name == "translation":
            features = {"source": tfds.features.Text(), "target": tfds.features.Text()}
        else:
            features = {"text": tfds.features.Text()}
        return self.dataset_info_from_configs(features=tfds.features.FeaturesDict(features))

    def _split_generators(self, dl_manager):
        del dl_manager   # nothing to download
        if not self._files["train"]:
            raise ValueError(f"{NAME}: preparing needs train_files; use "
                             "switchzoo.data.tfds_local.prepare(task, train_files, eval_files, "
                             "data_dir)")
        return {split: self._generate_examples(spec)
                for split, spec in self._files.items() if spec}

    def _generate_examples(self, spec: str):
        task = self.builder_config.name
        for i, example in enumerate(files.read(spec, task)):
            if task == "translation":
                yield i, {"source": example[0], "target": example[1]}
            else:
                yield i, {"text": example}


def prepare(task: str, train_files: str, eval_files: str, data_dir: str) -> str:
    """Builds ``local_text/<task>`` as array_record in ``data_dir``; returns its tfds name."""
    builder = LocalText(config=task, data_dir=data_dir, train_files=train_files,
                        eval_files=eval_files, file_format="array_record")
    builder.download_and_prepare()
    return f"{NAME}/{task}"
