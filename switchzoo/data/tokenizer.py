"""SentencePiece vocabulary: trained on the training split once, cached in the workdir.

Ids follow T5 / the flax examples: 0 pad, 1 eos (also the LM's start token), 2 unk, no bos. A
cached model is reused on resume and never silently retrained over: a run's checkpoints are
only meaningful with the vocabulary they were trained with.
"""
from __future__ import annotations

import io
import os
import pathlib
import re
from typing import Iterable

import sentencepiece as spm

from switchzoo import atomic

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
CACHE_NAME = "tokenizer.model"


class Tokenizer:
    """Text <-> ids. ``encode`` adds no EOS; ``decode`` stops at the first EOS, skips padding."""

    pad_id, eos_id = PAD_ID, EOS_ID

    def __init__(self, model_proto: bytes, path: str | None = None):
        self.path = path
        self.proto = model_proto
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        if (self._sp.pad_id(), self._sp.eos_id()) != (PAD_ID, EOS_ID):
            raise ValueError(f"SentencePiece model {path} has pad_id={self._sp.pad_id()}, "
                             f"eos_id={self._sp.eos_id()}; switchzoo needs pad 0 and eos 1: train "
                             "one with --config.data.vocab_path='' (a T5 model also works)")
        self.vocab_size = self._sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        # One string at a time: a list call starts a thread pool, ~15x slower for a pair.
        return self._sp.encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        if EOS_ID in ids:
            ids = ids[:ids.index(EOS_ID)]
        return self._sp.decode([i for i in ids if i != PAD_ID])

    def __getstate__(self):          # grain worker processes pickle transforms
        return {"proto": self.proto, "path": self.path}

    def __setstate__(self, state):
        self.__init__(state["proto"], state["path"])


def train(texts: Iterable[str], vocab_size: int, seed: int = 0) -> bytes:
    """A unigram model of ``texts`` (already capped by the caller) as serialized bytes."""
    spm.set_random_generator_seed(seed)
    out = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_writer=out, vocab_size=vocab_size,
            model_type="unigram", character_coverage=1.0, pad_id=PAD_ID, eos_id=EOS_ID,
            unk_id=UNK_ID, bos_id=-1, max_sentence_length=8192, shuffle_input_sentence=False,
            num_threads=os.cpu_count() or 1, minloglevel=2)
    except RuntimeError as e:
        most = re.search(r"Vocabulary size too high.*<= (\d+)", str(e))
        if most:
            raise ValueError(f"data.vocab_size={vocab_size} is too large for this training text; "
                             f"set --config.data.vocab_size to at most {most.group(1)}, or give "
                             "more text") from None
        raise
    return out.getvalue()


def load_or_train(cfg, workdir: str | os.PathLike | None, texts) -> Tokenizer:
    """cfg.vocab_path if set; else workdir/tokenizer.model if cached; else train and cache.

    ``texts`` is a zero-argument callable giving the training sentences, called only if needed.
    """
    if cfg.vocab_path:
        path = pathlib.Path(cfg.vocab_path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"data.vocab_path {path} does not exist; give an existing "
                                    "SentencePiece .model, or '' to train one in the workdir")
        return Tokenizer(path.read_bytes(), str(path))
    if not workdir:
        raise ValueError("no workdir to cache the trained tokenizer in and no data.vocab_path; "
                         "pass a workdir or --config.data.vocab_path=PATH.model")
    path = pathlib.Path(workdir) / CACHE_NAME
    if path.is_file():
        tok = Tokenizer(path.read_bytes(), str(path))
        if tok.vocab_size != cfg.vocab_size:
            raise ValueError(f"cached tokenizer {path} has vocab_size {tok.vocab_size} but the "
                             f"config asks for {cfg.vocab_size}; set --config.data.vocab_size="
                             f"{tok.vocab_size} to resume, or use a new workdir")
        return tok
    proto = train(texts(), cfg.vocab_size)
    atomic.write_bytes(path, proto)
    return Tokenizer(proto, str(path))
