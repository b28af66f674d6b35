"""SentencePiece vocabulary: trained on the training split once, cached in the workdir.

Ids follow T5 / the flax examples: 0 pad, 1 eos (also the LM's start token), 2 unk, no bos.
Like T5's vocabularies ("100extra"), 100 extra ids sit above the SentencePiece pieces: the span
corruption sentinels, ``<extra_id_0>`` = vocab_size - 1 counted down (a SentencePiece model that
already holds ``<extra_id_N>`` pieces, as some exported T5 ones do, must hold them there). A
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
from switchzoo.data import memo
from switchzoo.data.span_corruption import NUM_SENTINELS

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
CACHE_NAME = "tokenizer.model"
EXTRA_IDS = NUM_SENTINELS           # T5's "100extra"
_SENTINEL = re.compile(r"<extra_id_(\d+)>")
# A run's cached tokenizer that does not load: its checkpoints need the very same pieces.
NOT_A_MODEL_FIX = ("restore it from a copy of the run (its checkpoints were trained with it), or "
                   "start a new --workdir")


class Tokenizer:
    """Text <-> ids. ``encode`` adds no EOS; ``decode`` stops at the first EOS, skips padding
    and writes sentinels as ``<extra_id_N>``. ``vocab_size`` counts the extra ids;
    ``num_pieces`` does not."""

    pad_id, eos_id = PAD_ID, EOS_ID

    def __init__(self, model_proto: bytes, path: str | None = None):
        self.path = path
        self.proto = model_proto
        self._sp = spm.SentencePieceProcessor()
        try:        # an empty proto parses as a model of no pieces
            ok = bool(model_proto) and self._sp.LoadFromSerializedProto(model_proto)
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"{path or 'the tokenizer'} is not a SentencePiece model: "
                             + (NOT_A_MODEL_FIX if pathlib.Path(path or "").name == CACHE_NAME
                                else "give the .model file SentencePiece trained"))
        if (self._sp.pad_id(), self._sp.eos_id()) != (PAD_ID, EOS_ID):
            raise ValueError(f"SentencePiece model {path} has pad_id={self._sp.pad_id()}, "
                             f"eos_id={self._sp.eos_id()}; switchzoo needs pad 0 and eos 1: train "
                             "one with --config.data.vocab_path='' (a T5 model also works)")
        self.num_pieces = self._sp.get_piece_size()
        own = {int(m.group(1)): i for i in range(self.num_pieces)
               if (m := _SENTINEL.fullmatch(self._sp.id_to_piece(i)))}
        if own:      # the model carries its sentinels: they must be T5's, at the very top
            top = self.num_pieces - 1
            wrong = sorted(n for n, i in own.items() if i != top - n)
            missing = sorted(set(range(max(own) + 1)) - set(own))
            if wrong:
                n = wrong[0]
                raise ValueError(f"SentencePiece model {path} holds <extra_id_{n}> at id "
                                 f"{own[n]}, not at {top - n} (= size - 1 - {n}) where span "
                                 "corruption and T5/Switch checkpoints put it; use the model "
                                 "the checkpoint was trained with, or one without extra ids")
            if missing:
                raise ValueError(f"SentencePiece model {path} lacks <extra_id_{missing[0]}> "
                                 f"below <extra_id_{max(own)}>: its sentinels must be "
                                 "<extra_id_0> ... <extra_id_N> without gaps; use the model "
                                 "the checkpoint was trained with, or one without extra ids")
        self.num_sentinels = len(own) or EXTRA_IDS
        self.vocab_size = self.num_pieces + (0 if own else EXTRA_IDS)

    def sentinel(self, n: int) -> int:
        """The id of ``<extra_id_n>``."""
        if not 0 <= n < self.num_sentinels:
            raise ValueError(f"<extra_id_{n}> is not in this vocabulary ({self.num_sentinels} "
                             "sentinels)")
        return self.vocab_size - 1 - n

    def encode(self, text: str) -> list[int]:
        # One string at a time: a list call starts a thread pool, ~15x slower for a pair.
        return self._sp.encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        if EOS_ID in ids:
            ids = ids[:ids.index(EOS_ID)]
        out, run = [], []
        for i in ids:
            if i >= self.vocab_size:        # the model's padding ids beyond the vocabulary
                continue
            if i >= self.vocab_size - self.num_sentinels:     # <extra_id_N>, from the top
                out += [self._sp.decode(run), f"<extra_id_{self.vocab_size - 1 - i}>"]
                run = []
            elif i != PAD_ID:
                run.append(i)
        return "".join(out) + self._sp.decode(run)

    def __getstate__(self):          # grain worker processes pickle transforms
        return {"proto": self.proto, "path": self.path}

    def __setstate__(self, state):
        self.__init__(state["proto"], state["path"])


def train(texts: Iterable[str], vocab_size: int, seed: int = 0) -> bytes:
    """A unigram model of ``texts`` (already capped by the caller) as serialized bytes; the same
    texts and settings give the same bytes, so they are kept (switchzoo.data.memo)."""
    texts = list(texts)
    settings = dict(vocab_size=vocab_size, model_type="unigram", character_coverage=1.0,
                    pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
                    max_sentence_length=8192, shuffle_input_sentence=False,
                    num_threads=os.cpu_count() or 1, minloglevel=2)
    key = memo.key_of([spm.__version__, seed, *sorted(settings.items()), len(texts), *texts])
    return memo.bytes_of("tokenizer", key, lambda: _train(texts, settings, seed))


def _train(texts: list[str], settings: dict, seed: int) -> bytes:
    spm.set_random_generator_seed(seed)
    out = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=out,
                                       **settings)
    except RuntimeError as e:
        most = re.search(r"Vocabulary size too high.*<= (\d+)", str(e))
        if most:
            raise ValueError(f"data.vocab_size={settings['vocab_size']} is too large for this "
                             f"training text; set --config.data.vocab_size to at most "
                             f"{most.group(1)}, or give more text") from None
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
        if tok.num_pieces != cfg.vocab_size:
            raise ValueError(f"cached tokenizer {path} has vocab_size {tok.num_pieces} but the "
                             f"config asks for {cfg.vocab_size}; set --config.data.vocab_size="
                             f"{tok.num_pieces} to resume, or use a new workdir")
        return tok
    checkpoints = pathlib.Path(workdir) / "checkpoints"
    if checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir()):
        raise ValueError(f"{path} is missing, but {checkpoints} holds steps trained with it (a "
                         "new tokenizer would give other ids): restore it from a copy of the "
                         "run, or start a new --workdir")
    proto = train(texts(), cfg.vocab_size)
    atomic.write_bytes(path, proto)
    return Tokenizer(proto, str(path))
