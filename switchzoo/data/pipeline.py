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
(``SpanFeaturizer.skipped`` counts those of the training stream); of a longer document the first
MAX_CHUNKS chunks are kept (~36k tokens at 512). Evaluation corrupts with a fixed draw.

Training rows hold several examples (first-fit packing): ``*segments`` number them 1, 2, ...
(0 = padding) and ``*positions`` restart at 0 in each. Evaluation rows hold one example each.
"""
from __future__ import annotations

import json
from typing import Iterator, Sequence

import grain
import numpy as np

from switchzoo.data import span_corruption
from switchzoo.data.tokenizer import EOS_ID

MAX_CHUNKS = 64         # span corruption: chunks kept of one document (~36k tokens at 512)
EVAL_SEED = 0           # span corruption: the evaluation draw


def featurizer(tokenizer, task: str, max_length: int):
    """A raw example -> {"inputs", "targets"} int32 ids, at most ``max_length`` long."""
    keep = max_length - 1

    def translation(example) -> dict:
        source, target = tokenizer.encode(example[0]), tokenizer.encode(example[1])
        return {"inputs": np.array(source[:keep] + [EOS_ID], np.int32),
                "targets": np.array(target[:keep] + [EOS_ID], np.int32)}

    def lm(text) -> dict:
        ids = tokenizer.encode(text)[:keep]
        return {"inputs": np.array([EOS_ID] + ids, np.int32),
                "targets": np.array(ids + [EOS_ID], np.int32)}

    return translation if task == "translation" else lm


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

    def __call__(self, text: str, rng: np.random.Generator, count: bool = True) -> list[dict]:
        ids = self.tokenizer.encode(text)
        if len(ids) < 2:
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

    def evaluation(self, texts: list[str]) -> list[dict]:
        """The evaluation examples of ``texts``: a fixed draw per text, whatever the run's seed,
        so that runs compared in a table are scored on the same examples."""
        return [ex for i, text in enumerate(texts)
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
    """Endless packed batches; ``get_state()`` is a JSON-ready dict, ``set_state`` resumes exactly.

    The state records how far into the shuffled, repeated example stream the next batch starts,
    so no buffers are saved: the pipeline re-reads and re-packs from there. It is only valid for
    the same examples, batch size, length and seed, which it carries and checks.
    """

    def __init__(self, dataset: grain.IterDataset, signature: dict):
        self._iterator = iter(dataset)
        self._signature = signature

    def __iter__(self) -> "TrainIterator":
        return self

    def __next__(self) -> dict:
        return next(self._iterator)

    def get_state(self) -> dict:
        state = json.loads(json.dumps(self._iterator.get_state(), default=int))
        return {"grain": state, **self._signature}

    def set_state(self, state: dict) -> None:
        saved = {k: state.get(k) for k in self._signature}
        if saved != self._signature:
            raise ValueError(f"data iterator state was saved for {saved} but this pipeline has "
                             f"{self._signature}; resume with the same data, batch size, "
                             "max_length and seed, or start a new workdir")
        self._iterator.set_state(state["grain"])


def train_iterator(examples: Sequence, featurize, task: str, batch_size: int, max_length: int,
                   seed: int) -> TrainIterator:
    """Shuffle (a new order each epoch) -> repeat -> tokenize -> first-fit pack -> batch.

    Span corruption: ``featurize`` is a SpanFeaturizer (random_map: a draw per stream position,
    then its chunks flattened) and targets rows are its ``target_length`` long."""
    seed = seed % 2**32
    dataset = grain.MapDataset.source(examples).shuffle(seed=seed).repeat(None)
    spans = isinstance(featurize, SpanFeaturizer)
    target_length = featurize.target_length if spans else None
    dataset = dataset.random_map(featurize, seed=seed) if spans else dataset.map(featurize)
    # Tokenizing runs in this thread: SentencePiece holds the GIL, so threads would only add
    # hand-over cost (measured), and the order stays trivially determined.
    dataset = dataset.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    if spans:
        dataset = grain.experimental.FlatMapIterDataset(dataset, _Flatten())
    dataset = pack(dataset, task, batch_size, max_length, seed, target_length)
    signature = {"num_examples": len(examples), "batch_size": batch_size,
                 "max_length": max_length, "seed": seed}
    if target_length is not None:
        signature["target_length"] = target_length
    return TrainIterator(dataset, signature)


def pack(dataset: grain.IterDataset, task: str, batch_size: int, max_length: int,
         seed: int, target_length: int | None = None) -> grain.IterDataset:
    """Featurized examples -> batches of ``batch_size`` packed rows (the last one may be short)."""
    dataset = grain.experimental.FirstFitPackIterDataset(
        dataset, length_struct={"inputs": max_length, "targets": target_length or max_length},
        num_packing_bins=batch_size, seed=seed, shuffle_bins=True)
    return dataset.batch(batch_size).map(_rename(task))


def eval_batches(featurized: list[dict], task: str, batch_size: int, max_length: int,
                 num_words: list[int] | None = None,
                 target_length: int | None = None) -> Iterator[dict]:
    """One example per row, padded; the last batch is filled with weight-0 rows."""
    length = {"inputs": max_length, "targets": target_length or max_length}
    for start in range(0, len(featurized), batch_size):
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
        if task != "lm":
            for side in ("inputs", "targets"):
                batch[f"{side}_segments"] = segments[side]
                batch[f"{side}_positions"] = positions[side]
        else:
            batch["segments"], batch["positions"] = segments["targets"], positions["targets"]
            words = np.zeros(batch_size, np.int32)
            words[:len(rows)] = num_words[start:start + batch_size]
            batch["num_words"] = words
        batch["weights"] = (segments["targets"] > 0).astype(np.float32)
        yield batch
