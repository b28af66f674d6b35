"""Examples -> token ids -> packed training batches (Grain) and unpacked evaluation batches.

Translation: inputs = source ids + EOS, targets = target ids + EOS, each cut to L-1 ids first.
LM: EOS doubles as the start token, so one text of ids x becomes
    inputs  = EOS x1 ... xn        targets = x1 ... xn EOS
and the model predicts targets[t] from inputs[..t]. Every example carries its own start token,
so after packing no target ever depends on the example before it (with the segment mask), and
the first word of each text and its end are predicted too.

Span corruption (T5): one text of ids, cut into chunks of the raw length that corrupts to
exactly ``max_length`` inputs (``span_corruption.lengths``), becomes per chunk
    inputs  = kept spans with one sentinel per cut span, EOS
    targets = each sentinel followed by the span it replaced, EOS
with ``targets`` rows ``target_length`` long (114 for 512 inputs). The corruption's random draw
is fixed by the example's position in the stream (Grain's random_map), so a resumed run corrupts
exactly as the uninterrupted one. Unlike T5, which concatenates documents before chunking,
each document is corrupted on its own and packed with the segment mask: no span or attention
crosses a document boundary. Texts shorter than 2 tokens cannot be corrupted and are skipped
(``SpanFeaturizer.skipped`` counts those of the training stream, read ahead included); of a
longer document the first MAX_CHUNKS chunks are kept (~36k tokens at 512). Evaluation
corrupts with a fixed draw.

Training rows hold several examples (first-fit packing): ``*segments`` number them 1, 2, ...
(0 = padding) and ``*positions`` restart at 0 in each. Evaluation rows hold one example each.
"""
from __future__ import annotations

import json
import threading
from typing import Iterator, Sequence

import grain
import numpy as np

from switchzoo.data import span_corruption
from switchzoo.data.tokenizer import EOS_ID

MAX_CHUNKS = 64         # span corruption: chunks kept of one document (~36k tokens at 512)
EVAL_SEED = 0           # span corruption: the evaluation draw


def featurizer(tokenizer, task: str, max_length: int, target_length: int | None = None):
    """A raw example -> {"inputs", "targets"} int32 ids, at most ``max_length`` long (targets:
    ``target_length``, where given: text2text's targets rows)."""
    keep = max_length - 1
    keep_target = (target_length or max_length) - 1

    def translation(example) -> dict:
        source, target = tokenizer.encode(example[0]), tokenizer.encode(example[1])
        return {"inputs": np.array(source[:keep] + [EOS_ID], np.int32),
                "targets": np.array(target[:keep_target] + [EOS_ID], np.int32)}

    def lm(text) -> dict:
        ids = tokenizer.encode(text)[:keep]
        return {"inputs": np.array([EOS_ID] + ids, np.int32),
                "targets": np.array(ids + [EOS_ID], np.int32)}

    if target_length:
        translation.target_length = target_length      # the packer's targets rows
    return translation if task in ("translation", "text2text") else lm


class SpanFeaturizer:
    """A text and a numpy Generator -> a list of {"inputs", "targets"} (see the module doc)."""

    def __init__(self, tokenizer, inputs_length: int, noise_density: float,
                 mean_noise_span_length: float):
        self.tokenizer, self.density, self.span = tokenizer, noise_density, mean_noise_span_length
        self.raw, self.target_length = span_corruption.lengths(
            inputs_length, noise_density, mean_noise_span_length)
        if self.raw < 2:        # only max_length 2: 3 holds a 2-token chunk at any noise
            raise ValueError(f"max_length={inputs_length} leaves no room for span corruption "
                             f"(a chunk of {self.raw} token); set --config.max_length to at "
                             "least 3")
        spans = span_corruption.max_spans(self.raw, noise_density, mean_noise_span_length)
        if spans > tokenizer.num_sentinels:
            raise ValueError(
                f"span corruption of {self.raw}-token chunks makes up to {spans} spans but the "
                f"vocabulary {tokenizer.path or ''} has {tokenizer.num_sentinels} sentinel ids "
                "(<extra_id_N>); use one with 100 extra ids (--config.data.vocab_path='' trains "
                "one) or a shorter --config.max_length")
        self.skipped = 0
        self._count = threading.Lock()      # read-ahead: each shard's stream has a thread

    def __call__(self, text: str, rng: np.random.Generator, count: bool = True) -> list[dict]:
        ids = self.tokenizer.encode(text)
        if len(ids) < 2:
            with self._count:
                self.skipped += count
            return []
        out = []
        for start in range(0, min(len(ids), self.raw * MAX_CHUNKS), self.raw):
            chunk = ids[start:start + self.raw]
            if len(chunk) < 2:      # a last single token cannot be corrupted
                break
            inputs, targets = span_corruption.corrupt(
                chunk, vocab_size=self.tokenizer.vocab_size, noise_density=self.density,
                mean_noise_span_length=self.span, rng=rng)
            out.append({"inputs": np.append(inputs, np.int32(EOS_ID)),
                        "targets": np.append(targets, np.int32(EOS_ID))})
        return out

    def evaluation(self, texts: list[str], first: int = 0) -> list[dict]:
        """The evaluation examples of ``texts`` (texts first, first + 1, ... of the eval set):
        a fixed draw per text, whatever the run's seed or the process reading it, so that runs
        compared in a table are scored on the same examples."""
        return [ex for i, text in enumerate(texts, first)
                for ex in self(text, np.random.default_rng([EVAL_SEED, i]), count=False)]


class _Flatten(grain.experimental.FlatMapTransform):
    max_fan_out = MAX_CHUNKS

    def flat_map(self, examples):
        return examples


def _rename(task: str):
    """Grain's packed names -> ours, plus weights (1 on real target tokens)."""
    def fn(batch: dict) -> dict:
        out = {"inputs": batch["inputs"], "targets": batch["targets"]}
        if task != "lm":
            for side in ("inputs", "targets"):
                out[f"{side}_segments"] = batch[f"{side}_segment_ids"]
                out[f"{side}_positions"] = batch[f"{side}_positions"]
            segments = out["targets_segments"]
        else:   # inputs and targets have equal lengths, so one segmentation serves both
            out["segments"] = segments = batch["targets_segment_ids"]
            out["positions"] = batch["targets_positions"]
        out["weights"] = (segments > 0).astype(np.float32)
        return out
    return fn


class TrainIterator:
    """Endless packed batches of this process's rows; ``get_state()`` is a JSON-ready dict,
    ``set_state`` resumes exactly.

    The global batch is ``shards`` input shards, each packed from a stream of its own: shard s
    reads examples start + s, start + s + shards, ... of the shuffled, repeated example stream
    and fills rows s x B/shards onwards. This process runs the streams that hold its ``rows``
    and yields those rows, so the global batch depends on the input shard count alone, never
    on the mesh or the process count (a run's count defaults to its first mesh's batch shard
    count, switchzoo.hosts).

    The state records, per shard, how far into its stream the next batch starts, so no
    buffers are saved: the pipeline re-reads and re-packs from there. A state of the same
    batch size resumes exactly on any mesh and process count: it keeps the state's input
    shard count (``continued`` says so when it differs), unless ``fixed`` (data.input_shards
    set) asks for another. Another batch size or input shard count restarts every stream at
    the first example some shard had not read (``reshaped`` says so), which re-reads at most
    shards x (the shards' spread + a batch) examples.

    With read-ahead (``train_iterator(prefetch=N)``) each shard's stream runs in a thread of
    its own (Grain's ThreadPrefetchIterDataset), up to N batches ahead of ``next``. Every
    batch travels with its stream's state after it, so ``get_state`` is the state after the
    last batch ``next`` returned, never after those read ahead, and batches, states and their
    order are those of the same iterator without read-ahead. A stream's exception is raised
    again, as it was, by the ``next`` that reaches it. ``close()`` stops the threads.
    """

    def __init__(self, make_stream, shards: int, rows: tuple[int, int], signature: dict,
                 fixed: bool = False):
        self._make, self.rows, self._signature = make_stream, rows, signature
        self.fixed = fixed              # data.input_shards set: a resume never adopts another
        self.reshaped = ""              # set_state: what a reshaped resume did, else ""
        self.continued = ""             # set_state: the run's own shard count kept, else ""
        self._use(shards)
        self._restart(0)

    def _use(self, shards: int) -> None:
        """Input shards: this process runs the streams that hold its ``rows`` (a stream another
        process also holds rows of is run by both; each keeps its own rows)."""
        batch = self._signature["batch_size"]
        if shards < 1 or batch % shards:
            raise ValueError(f"a batch of {batch} rows does not split into {shards} input "
                             f"shards; set data.input_shards to a divisor of {batch} (0: one "
                             "per batch shard of the mesh)")
        per, (a, b) = batch // shards, self.rows
        self.shards, self.local = shards, range(a // per, -(-b // per))
        self._cut = slice(a - self.local.start * per, b - self.local.start * per)

    def _restart(self, start: int) -> None:
        self.close()                    # the old streams' threads, if any, read no further
        self.start = start
        self._iterators = {s: iter(self._make(s, start, self.shards)) for s in self.local}

    def close(self) -> None:
        """Stops the read-ahead threads (idempotent); the iterator is done with."""
        for it in getattr(self, "_iterators", {}).values():
            it.close()

    def __iter__(self) -> "TrainIterator":
        return self

    @property
    def num_examples(self) -> int:
        return self._signature["num_examples"]

    def __next__(self) -> dict:
        parts = [next(self._iterators[s]) for s in self.local]
        return {k: np.concatenate([p[k] for p in parts])[self._cut] for k in parts[0]}

    def get_state(self) -> dict:
        """This process's shards; ``merge_states`` joins the states of all processes."""
        shards = {str(s): json.loads(json.dumps(it.get_state(), default=int))
                  for s, it in self._iterators.items()}
        return {"shards": shards, "num_shards": self.shards, "start": self.start,
                **self._signature}

    def set_state(self, state: dict) -> None:
        state = _upgrade(state)
        saved = {k: state.get(k) for k in self._signature}
        if any(saved[k] != v for k, v in self._signature.items() if k != "batch_size"):
            raise ValueError(f"data iterator state was saved for {saved} but this pipeline has "
                             f"{self._signature}; resume with the same data, max_length and "
                             "seed, or start a new workdir")
        same_batch = state["batch_size"] == self._signature["batch_size"]
        if same_batch and state["num_shards"] != self.shards and not self.fixed:
            self.continued = (
                f"data: the run's input is {state['num_shards']} input shards; this mesh's "
                f"{self.shards} batch shards read them as the run began, so the batches go on "
                "exactly (data.input_shards fixes the count for new runs)")
            self._use(state["num_shards"])
        exact = (state["num_shards"] == self.shards and same_batch
                 and all(str(s) in state["shards"] for s in self.local))
        if exact:
            self._restart(state["start"])
            for s in self.local:
                self._iterators[s].set_state(state["shards"][str(s)])
            return
        read = [_source_position(v) for v in state["shards"].values()]
        old = state["num_shards"]
        start = state["start"] + old * min(read)
        self.reshaped = (
            f"data: the checkpoint's input was {old} batch shards of "
            f"{state['batch_size'] // old} rows, this run reads {self.shards} of "
            f"{self._signature['batch_size'] // self.shards}: every stream restarts at example "
            f"{start:,} of the shuffled stream (the first one some shard had not read; up to "
            f"{old * (max(read) - min(read)):,} examples after it were read before and are read "
            "again, and examples the packers held unfinished are skipped)")
        self._restart(start)


def merge_states(states: list[dict]) -> dict:
    """The states of every process (their shards) -> one state of the whole global batch."""
    merged = dict(states[0], shards={})
    for state in states:
        merged["shards"].update(state["shards"])
    return merged


def _upgrade(state: dict) -> dict:
    """A state saved before batch shards existed (one stream of the whole batch)."""
    if "shards" in state:
        return state
    rest = {k: v for k, v in state.items() if k != "grain"}
    return {**rest, "shards": {"0": state["grain"]}, "num_shards": 1, "start": 0}


def _source_position(state) -> int:
    """How many examples a stream's source has handed on: the innermost ``next_index``."""
    if isinstance(state, dict):
        inner = [_source_position(v) for v in state.values() if isinstance(v, dict)]
        inner = [x for x in inner if x is not None]
        if inner:
            return inner[0]
        if "next_index" in state:
            return int(state["next_index"])
    return None


def shard_seed(seed: int, shard: int) -> int:
    """Each shard's own draws (shard 0 keeps the run's seed, as before shards existed)."""
    return (seed + 1_000_003 * shard) % 2**32


def train_iterator(examples: Sequence, featurize, task: str, batch_size: int, max_length: int,
                   seed: int, shards: int = 1, rows: tuple[int, int] | None = None,
                   prefetch: int = 0, fixed: bool = False) -> TrainIterator:
    """Shuffle (a new order each epoch) -> repeat -> this shard's examples -> tokenize ->
    first-fit pack -> batches of ``batch_size // shards`` rows per input shard (-> ``prefetch``
    batches read ahead in a thread per shard; 0: in the caller's thread). ``rows``: [a, b),
    the global rows this process reads (default all); ``fixed``: see TrainIterator.

    Span corruption: ``featurize`` is a SpanFeaturizer (random_map: a draw per stream position,
    then its chunks flattened) and targets rows are its ``target_length`` long."""
    seed = seed % 2**32
    spans = isinstance(featurize, SpanFeaturizer)
    target_length = getattr(featurize, "target_length", None)

    def stream(shard: int, start: int, shards: int) -> grain.IterDataset:
        own = shard_seed(seed, shard)
        dataset = grain.MapDataset.source(examples).shuffle(seed=seed).repeat(None)
        if shards > 1 or start:
            dataset = dataset[start + shard::shards]
        dataset = dataset.random_map(featurize, seed=own) if spans else dataset.map(featurize)
        # Tokenizing runs in the stream's thread: SentencePiece holds the GIL, so threads per
        # example would only add hand-over cost (measured), and the order stays trivially
        # determined.
        dataset = dataset.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
        if spans:
            dataset = grain.experimental.FlatMapIterDataset(dataset, _Flatten())
        dataset = pack(dataset, task, batch_size // shards, max_length, own, target_length)
        # A thread, not processes: it takes tokenizing and packing (pure Python, ~25 ms a demo
        # batch) off the training thread, and keeps the state format, so checkpoints resume
        # with read-ahead on or off. Its state is its parent's as of the batch handed on.
        return (grain.experimental.ThreadPrefetchIterDataset(dataset, prefetch_buffer_size=prefetch)
                if prefetch else dataset)

    signature = {"num_examples": len(examples), "batch_size": batch_size,
                 "max_length": max_length, "seed": seed}
    if target_length is not None:
        signature["target_length"] = target_length
    if prefetch < 0:
        raise ValueError(f"prefetch={prefetch}: read-ahead is a number of batches, 0 for none")
    return TrainIterator(stream, shards, (0, batch_size) if rows is None else rows, signature,
                         fixed)


def pack(dataset: grain.IterDataset, task: str, batch_size: int, max_length: int,
         seed: int, target_length: int | None = None) -> grain.IterDataset:
    """Featurized examples -> batches of ``batch_size`` packed rows (the last one may be short)."""
    dataset = grain.experimental.FirstFitPackIterDataset(
        dataset, length_struct={"inputs": max_length, "targets": target_length or max_length},
        num_packing_bins=batch_size, seed=seed, shuffle_bins=True)
    return dataset.batch(batch_size).map(_rename(task))


def eval_batches(featurized: list[dict], task: str, batch_size: int, max_length: int,
                 num_words: list[int] | None = None,
                 target_length: int | None = None, num_batches: int = 0) -> Iterator[dict]:
    """One example per row, padded (with each row's length: ``lengths``, ``inputs_lengths`` and
    ``targets_lengths``); the last batch is filled with weight-0 rows, and batches of weight-0
    rows follow up to ``num_batches`` (every process runs as many)."""
    length = {"inputs": max_length, "targets": target_length or max_length}
    for start in range(0, max(len(featurized), num_batches * batch_size), batch_size):
        rows = featurized[start:start + batch_size]
        batch = {side: np.zeros((batch_size, length[side]), np.int32)
                 for side in ("inputs", "targets")}
        segments = {side: np.zeros((batch_size, length[side]), np.int32)
                    for side in ("inputs", "targets")}
        for i, row in enumerate(rows):
            for side in ("inputs", "targets"):
                batch[side][i, :len(row[side])] = row[side]
                segments[side][i, :len(row[side])] = 1
        positions = {side: np.where(segments[side] > 0,
                                    np.arange(length[side], dtype=np.int32), 0)
                     for side in ("inputs", "targets")}
        # One sequence per row, right-padded: its length, so that attention masks by length
        # (cuDNN's padding mask) rather than by a [B, T, S] mask (switchzoo.layers.Mask).
        lengths = {side: np.sum(segments[side], axis=1, dtype=np.int32)
                   for side in ("inputs", "targets")}
        if task != "lm":
            for side in ("inputs", "targets"):
                batch[f"{side}_segments"] = segments[side]
                batch[f"{side}_positions"] = positions[side]
                batch[f"{side}_lengths"] = lengths[side]
        else:
            batch["segments"], batch["positions"] = segments["targets"], positions["targets"]
            batch["lengths"] = lengths["targets"]
            words = np.zeros(batch_size, np.int32)
            words[:len(rows)] = num_words[start:start + batch_size]
            batch["num_words"] = words
        batch["weights"] = (segments["targets"] > 0).astype(np.float32)
        yield batch
