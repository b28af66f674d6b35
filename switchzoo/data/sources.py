"""Where examples come from: the embedded corpus, local files, or a prepared tfds dataset.

Every source yields raw examples, (source_text, target_text) for translation or a text for the
text tasks (LM, span corruption): a random-access training split (what Grain shuffles) and a
short evaluation list.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import zlib
from typing import Sequence

from switchzoo import atomic
from switchzoo.data import embedded, files, manuals

SOURCES = ("embedded", "files", "tfds")


def reads_texts(task: str) -> bool:
    """True for the tasks whose examples are single texts (not pairs)."""
    return task not in ("translation", "text2text")


@dataclasses.dataclass
class Corpus:
    train: Sequence        # random access: len() and [i]
    eval: list             # capped at max_eval_examples
    description: str
    eval_split: str = "held out"     # what the evaluation examples are


def load(cfg, task: str, workdir) -> Corpus:
    if cfg.source == "embedded":
        cache = pathlib.Path(workdir) / "data" if workdir else None
        pair = cfg.pair
        if task == "span_corruption":          # the English side: make it the target
            pair = "-".join(sorted(pair.split("-"), key=lambda lang: lang == "en"))
        train, held, description = embedded.load(pair, task, cache, cfg.embedded_max_pairs,
                                                 pathlib.Path(cfg.locale_dir))
        if task == "span_corruption":      # running text beside the short messages
            prose, note = _manuals(pathlib.Path(cfg.info_dir), cache)
            more, more_held = files.hold_out(prose)
            train = train + more
            # evaluation mixes both (max_eval_examples takes the first ones)
            held = sorted(held + more_held, key=lambda t: zlib.crc32(t.encode("utf-8")))
            description += note
        corpus = Corpus(train, held, description)
    elif cfg.source == "files":
        if not cfg.train_files:
            raise ValueError("data.source=files needs --config.data.train_files=A[,B] (translation:"
                             " TSV source<TAB>target; LM: one text per line; .gz allowed)")
        train = files.read(cfg.train_files, task)
        if cfg.eval_files:
            held = files.read(cfg.eval_files, task)
        else:   # no eval split given: hold ~2% of the training files out
            train, held = files.hold_out(train)
        corpus = Corpus(train, held, f"files {cfg.train_files}",
                        cfg.eval_files or "held out of train_files")
    elif cfg.source == "tfds":
        corpus = _tfds(cfg, task)
    else:
        raise ValueError(f"unknown data.source '{cfg.source}'; use one of {', '.join(SOURCES)}")
    if not len(corpus.train):
        raise ValueError(f"{corpus.description}: the training split is empty; give more data")
    return _capped(corpus, cfg)


def _manuals(info_dir: pathlib.Path, cache: pathlib.Path | None) -> tuple[list[str], str]:
    """The GNU manuals' paragraphs, cached in the workdir like the embedded corpus."""
    path = cache / "manuals.txt" if cache else None
    if path is not None and path.is_file():
        prose = files.read_texts(path) if path.stat().st_size else []
        return prose, f" + {len(prose):,} paragraphs of GNU manuals cached in {path}"
    prose = manuals.paragraphs(info_dir)
    if path is not None:
        atomic.write_text(path, "".join(t + "\n" for t in prose))
    return prose, (f" + {len(prose):,} paragraphs of the GNU manuals in {info_dir} "
                   f"({len(manuals.files(info_dir))} files)")


def eval_files(cfg, task: str) -> Corpus:
    """Evaluation examples from data.eval_files alone (no training split)."""
    return _capped(Corpus([], files.read(cfg.eval_files, task), f"files {cfg.eval_files}",
                          cfg.eval_files), cfg)


def _capped(corpus: Corpus, cfg) -> Corpus:
    if cfg.max_eval_examples > 0:
        corpus.eval = corpus.eval[:cfg.max_eval_examples]
    return corpus


def sample(train: Sequence, task: str, max_sentences: int) -> list[str]:
    """Up to ``max_sentences`` sentences, evenly strided over the split, for the vocabulary."""
    per_example = 1 if reads_texts(task) else 2
    count = min(len(train), max(1, max_sentences // per_example))
    stride = len(train) / count
    texts = []
    for k in range(count):
        example = train[int(k * stride)]
        texts.extend((example,) if reads_texts(task) else example)
    return texts


class _TfdsView:
    """A tfds data source seen as raw examples: feature bytes -> str."""

    def __init__(self, source, keys: tuple[str, ...]):
        self._source, self._keys = source, keys

    def __len__(self):
        return len(self._source)

    def __getitem__(self, i):
        record = self._source[i]
        texts = tuple(_text(record[k]) for k in self._keys)
        return texts if len(texts) > 1 else texts[0]


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _tfds(cfg, task: str) -> Corpus:
    import tensorflow_datasets as tfds
    from switchzoo.data import tfds_local  # noqa: F401  registers local_text
    name, data_dir = cfg.tfds_name or default_tfds_name(cfg.pair, task), cfg.tfds_data_dir or None
    where = data_dir or "the default tfds data_dir (~/tensorflow_datasets or $TFDS_DATA_DIR)"
    fix = (f"tfds dataset '{name}' is not prepared in {where}; {prepare_command(name)}, then "
           "set --config.data.tfds_data_dir=DIR (a copy of its DIR/NAME/VERSION will do), or "
           "train on local files with --config.data.source=files --config.data.train_files=...")
    prepared = prepared_dir(name, data_dir)
    if prepared is not None:     # read the files as written: no builder code (c4 and wmt14's
        builder = tfds.builder_from_directory(str(prepared))     # import TensorFlow)
    else:
        try:
            builder = tfds.builder(name, data_dir=data_dir)
        except (tfds.core.registered.DatasetNotFoundError, ImportError):
            raise ValueError(fix) from None
        if not builder.is_prepared():
            raise ValueError(fix)
    features = set(builder.info.features.keys())
    if reads_texts(task):
        keys = ("text",) if "text" in features else tuple(sorted(features))[:1]
    elif {"source", "target"} <= features:
        keys = ("source", "target")
    else:
        keys = tuple(cfg.pair.split("-"))
        if len(keys) != 2 or not set(keys) <= features:
            raise ValueError(f"data.pair '{cfg.pair}' does not match the features "
                             f"{sorted(features)} of {name}; set --config.data.pair=SRC-TGT from "
                             "those (e.g. en-de for English to German)")
    eval_split = cfg.eval_split or ("validation" if "validation" in builder.info.splits
                                    else "test")
    splits = {}
    for split in (cfg.train_split, eval_split):
        if split not in builder.info.splits:
            raise ValueError(f"{name} has no split '{split}' (it has {list(builder.info.splits)})"
                             "; set --config.data.train_split / --config.data.eval_split")
        try:
            splits[split] = _TfdsView(builder.as_data_source(split), keys)
        except NotImplementedError:
            raise ValueError(f"{name} in {where} was prepared as tfrecord, which has no random "
                             "access; prepare it again with file_format='array_record' in "
                             "another data_dir") from None
    held = splits[eval_split]
    cap = len(held) if cfg.max_eval_examples <= 0 else min(len(held), cfg.max_eval_examples)
    return Corpus(splits[cfg.train_split], [held[i] for i in range(cap)],
                  f"tfds {name} ({cfg.train_split}; evaluation: {eval_split})", eval_split)


def prepare_command(name: str) -> str:
    """How to prepare tfds dataset ``name`` (the README says the same): once, as array_record,
    where there is internet and TensorFlow (the builders of wmt14, lm1b and c4 import it)."""
    base = name.partition(":")[0]
    if base.split("/")[0] == "local_text":
        return ("prepare it from local files with python -c \"from switchzoo.data import "
                f"tfds_local; tfds_local.prepare('{base.split('/')[-1]}', 'train.tsv', 'dev.tsv', "
                "'DIR')\"")
    return ("prepare it once, where there is internet and TensorFlow, with "
            f"tfds build {base} --file_format=array_record --data_dir=DIR")


def prepared_dir(name: str, data_dir: str | None) -> pathlib.Path | None:
    """DATA_DIR/NAME/VERSION of a prepared tfds dataset (``name`` as "c4/en" or "c4/en:3.1.0";
    the newest version without one), or None."""
    root = pathlib.Path(data_dir or os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets"))
    name, _, version = name.partition(":")
    base = root.expanduser() / name
    if version:
        candidates = [base / version]
    else:
        candidates = sorted((p for p in base.glob("*.*.*")      # not tfds's incomplete.*
                             if p.is_dir() and re.fullmatch(r"\d+\.\d+\.\d+", p.name)),
                            key=lambda p: tuple(map(int, p.name.split("."))))
    ready = [p for p in candidates if (p / "dataset_info.json").is_file()]
    return ready[-1] if ready else None


def default_tfds_name(pair: str, task: str) -> str:
    """What data.tfds_name="" means: WMT'14 for translation, LM1B for language modelling, C4
    (English) for span corruption."""
    if task == "lm":
        return "lm1b"
    if task == "span_corruption":
        return "c4/en"
    other = [lang for lang in pair.split("-") if lang != "en"]
    if len(pair.split("-")) != 2 or len(other) != 1 or other[0] not in ("de", "fr"):
        raise ValueError(f"data.pair '{pair}' has no WMT'14 dataset: use en-de, de-en, en-fr or "
                         "fr-en, or name a prepared dataset with --config.data.tfds_name")
    return f"wmt14_translate/{other[0]}-en"
