"""Input pipelines: a source of raw examples, a SentencePiece vocabulary, packed Grain batches.

    d = data.build(config.data, workdir, task="translation", batch_size=B, max_length=L, seed=S)
    batch = next(d.train)                  # packed [B, L] arrays; d.train.get_state() to save
    d.train.close()                        # stops its read-ahead threads (cfg.prefetch)
    for batch in d.eval_batches(): ...     # unpacked, one example per row, finite
    d.tokenizer.decode(ids); d.eval_examples

Tasks: "translation" (source, target) pairs; "lm" texts; "span_corruption" texts corrupted as
T5 does (pipeline.SpanFeaturizer: inputs ``max_length``, targets ``d.target_length``);
"text2text" a downstream task's T5 strings (switchzoo.tasks, the run config's ``finetune``
block: its source replaces config.data's; targets rows ``finetune.target_length`` long).

Sources (config.data.source): "embedded" (the shipped gettext corpus, offline, plus this
machine's catalogues),
"files" (local TSV / text, gzip allowed), "tfds" (a prepared array_record tfds dataset:
wmt14_translate/de-en, wmt14_translate/fr-en, lm1b, c4/en, or local_text/* from tfds_local).
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

import ml_collections
import numpy as np

from switchzoo import scores, tasks
from switchzoo.data import pipeline, sources
from switchzoo.data import tokenizer as tokenizer_lib
from switchzoo.data.text import byte_lm_batches, default_corpus

TASKS = ("translation", "lm", "span_corruption", "text2text")

__all__ = ["Data", "build", "default_config", "byte_lm_batches", "default_corpus"]


def default_config() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(dict(
        source="embedded",          # embedded | files | tfds
        train_files="",             # comma-separated; translation TSV source<TAB>target, LM lines
        eval_files="",              # "" with source=files: hold ~2% of train_files out
        tfds_name="",               # "": wmt14_translate/<xx>-en for translation (pair en-xx or
                                    # xx-en), lm1b for lm; or any prepared name
        tfds_data_dir="",           # "" = tfds default (~/tensorflow_datasets)
        train_split="train",        # tfds: the split trained on
        eval_split="",              # "": validation where the dataset has one, else test
        pair="en-de",               # source-target; the embedded LM corpus is the target side,
                                    # span corruption's the English side
        noise_density=0.15,         # span corruption: fraction of tokens cut (T5, Switch)
        mean_noise_span_length=3.0,  # span corruption: mean tokens per cut span
        vocab_path="",              # a SentencePiece .model; "" = train, cache workdir/tokenizer.model
        vocab_size=8000,            # SentencePiece pieces trained (+100 span sentinels)
        spm_max_sentences=200_000,  # sentences the vocabulary is trained on, at most
        max_eval_examples=1000,     # held-out examples evaluated (0: all)
        embedded_max_pairs=0,       # 0 = all
        locale_dir="/usr/share/locale",  # embedded: this machine's catalogues add pairs
        info_dir="/usr/share/info",  # embedded span corruption: GNU manuals add running text
        input_shards=0,             # streams the global batch is packed from, each its own rows;
                                    # 0: one per batch shard of the run's first mesh (a resume
                                    # on another mesh keeps the run's count)
        prefetch=2,                 # training batches read ahead, per input shard, in a thread
                                    # of its own, the next one placed on the devices during the
                                    # step; 0: all in the training thread
    ))


@dataclasses.dataclass
class Data:
    """What a run reads: see the module docstring. ``train`` is shared; ``eval_batches`` fresh."""
    tokenizer: tokenizer_lib.Tokenizer
    train: pipeline.TrainIterator
    eval_examples: list
    task: str
    batch_size: int
    max_length: int
    description: str
    eval_split: str = "held out"
    spans: pipeline.SpanFeaturizer | None = None     # span corruption's featurizer
    task_examples: dict | None = None                # text2text: {Task: its eval Examples}
    targets_length: int | None = None                # text2text: targets rows
    _eval_cache: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def target_length(self) -> int:
        if self.spans:
            return self.spans.target_length
        return self.targets_length or self.max_length

    def eval_batches(self, shards: int = 1, local: range | None = None,
                     num_batches: int = 0) -> Iterator[dict]:
        """This process's rows of each evaluation batch: the eval set is cut into ``shards``
        contiguous parts, part s filling shard s's rows (``local``: the shards read here,
        default all); every shard runs ``num_batches`` batches at least (weight-0 rows), so
        that processes holding shorter parts run as many steps as the others."""
        local = range(shards) if local is None else local
        per = self.batch_size // shards
        parts = [self._eval_part(shards, s) for s in local]
        n = max([num_batches] + [-(-len(f) // per) for f, _ in parts])
        streams = [pipeline.eval_batches(f, self.task, per, self.max_length, w,
                                         self.target_length, n) for f, w in parts]
        for pieces in zip(*streams):
            yield {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]}

    def eval_batch_count(self, shards: int = 1, local: range | None = None) -> int:
        """Batches this process's shards need (processes agree on the largest)."""
        per = self.batch_size // shards
        return max(-(-len(self._eval_part(shards, s)[0]) // per)
                   for s in (range(shards) if local is None else local))

    def _eval_part(self, shards: int, shard: int) -> tuple[list[dict], list[int] | None]:
        """(featurized examples, word counts) of part ``shard`` of the eval set; tokenized once."""
        key = (shards, shard)
        if key not in self._eval_cache:
            lo, hi = part(len(self.eval_examples), shards, shard)
            texts = self.eval_examples[lo:hi]
            if self.spans:
                features = self.spans.evaluation(texts, first=lo)
            else:
                featurize = pipeline.featurizer(self.tokenizer, self.task, self.max_length,
                                                self.targets_length)
                features = [featurize(e) for e in texts]
            words = [scores.count_words([t]) for t in texts] if self.task == "lm" else None
            self._eval_cache[key] = (features, words)
        return self._eval_cache[key]


def part(n: int, parts: int, index: int) -> tuple[int, int]:
    """[lo, hi) of part ``index`` when ``n`` items are cut into ``parts`` contiguous parts whose
    sizes differ by at most one."""
    return index * n // parts, (index + 1) * n // parts


def build(cfg: ml_collections.ConfigDict, workdir, task: str = "translation", *,
          batch_size: int, max_length: int, seed: int = 0, evaluating: bool = False,
          shards: int = 1, rows: tuple[int, int] | None = None, run=None) -> Data:
    """The train iterator, eval batches and tokenizer for ``task`` (one of TASKS).

    The workdir holds the tokenizer (and the embedded corpus) so a resumed run reads exactly
    what it started with. ``evaluating``: no train iterator, and ``cfg.eval_files`` are the
    evaluation examples whatever the source (a trained run scored on other text).
    ``shards``: the input shards the global batch is packed from; ``rows``: [a, b), the
    global rows this process reads (switchzoo.hosts.Share.row_range); only the examples of
    the input shards holding them are ever tokenized here. ``run``: the run config, whose
    ``finetune`` block names a text2text task's source.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task '{task}'; use one of {', '.join(TASKS)}")
    if max_length < 2 or batch_size < 1:
        raise ValueError(f"max_length={max_length} and batch_size={batch_size}: need a length of "
                         "at least 2 (one token + EOS) and a batch of at least 1")
    task_examples, targets_length = None, None
    if task == "text2text":
        corpus, task_examples = finetune_corpus(run, evaluating)
        targets_length = run.finetune.target_length or max_length
        load_train = lambda: corpus.train                              # noqa: E731
    elif evaluating and cfg.eval_files:
        corpus = sources.eval_files(cfg, task)
        load_train = lambda: sources.load(cfg, task, workdir).train   # noqa: E731
    else:
        corpus = sources.load(cfg, task, workdir)
        load_train = lambda: corpus.train                              # noqa: E731
    tok = tokenizer_lib.load_or_train(
        cfg, workdir, lambda: sources.sample(load_train(), task, cfg.spm_max_sentences))
    spans = None
    if task == "span_corruption":
        spans = pipeline.SpanFeaturizer(tok, max_length, cfg.noise_density,
                                        cfg.mean_noise_span_length)
    featurize = spans or pipeline.featurizer(tok, task, max_length, targets_length)
    train = (None if evaluating else
             pipeline.train_iterator(corpus.train, featurize, task, batch_size, max_length, seed,
                                     shards, rows, cfg.get("prefetch", 0),
                                     fixed=bool(cfg.get("input_shards", 0))))
    return Data(tok, train, corpus.eval, task, batch_size, max_length, corpus.description,
                corpus.eval_split, spans, task_examples, targets_length)


def finetune_corpus(run, evaluating: bool) -> tuple[sources.Corpus, dict]:
    """A text2text run's (input, target) pairs: the training split of its task (of every member
    of a mixture, each capped at finetune.mixture_cap pairs: T5's examples-proportional cap, as a
    fixed random subset (seed 0) where T5 samples a member anew each epoch), a pair per
    training target; and {task: Examples} of finetune.eval_split (capped at
    data.max_eval_examples), whose first targets are the eval pairs."""
    cfg = run.finetune
    members = tasks.resolve(cfg)
    tasks.check_best_metric(members, cfg.best_metric)
    train, seen = [], set()
    if not evaluating:
        for task in members:
            if (task.source, task.split("train")) in seen:    # MNLI's two members: one train
                continue
            seen.add((task.source, task.split("train")))
            pairs = [(e.inputs, t) for e in tasks.examples(task, "train", run) for t in e.targets]
            if cfg.mixture_cap and len(pairs) > cfg.mixture_cap:
                keep = np.random.default_rng(0).permutation(len(pairs))[:cfg.mixture_cap]
                pairs = [pairs[i] for i in sorted(keep)]
            train.extend(pairs)
    held, pairs = {}, []
    for task in members:
        examples = tasks.examples(task, cfg.eval_split, run)
        if run.data.max_eval_examples > 0:
            examples = examples[:run.data.max_eval_examples]
        held[task] = examples
        pairs.extend((e.inputs, e.targets[0]) for e in examples)
    name = cfg.task if cfg.task != tasks.FILES else f"files {cfg.train_files}"
    return (sources.Corpus(train if not evaluating else [], pairs,
                           f"task {name} ({len(train):,} training pairs; evaluation: "
                           f"{cfg.eval_split})", cfg.eval_split), held)
