"""T5's span corruption (Raffel et al. 2020, sec. 3.1.4), the Switch paper's pre-training task.

    inputs, targets = corrupt(ids, vocab_size=V, noise_density=0.15, mean_noise_span_length=3.0,
                              rng=np.random.default_rng(0))

A fraction ``noise_density`` of the tokens, in spans of mean length ``mean_noise_span_length``,
is cut out of the input; each cut span leaves one sentinel in ``inputs``, and ``targets`` lists
the cut spans, each after the same sentinel. Sentinels are the vocabulary's top ids counted
down (``<extra_id_0>`` = V - 1, ``<extra_id_1>`` = V - 2, ...), as in T5 and the Hugging Face
Switch checkpoints. The counts follow T5's ``random_spans_noise_mask``: round(n * density) noise
tokens (at least 1, fewer than n) in round(noise / mean span) spans (at least 1), span
boundaries uniformly random, a non-noise span first. No EOS is added here; ``lengths`` gives
the raw length whose corrupted inputs and targets, each with its EOS, fill their rows exactly.
"""
from __future__ import annotations

import numpy as np

NUM_SENTINELS = 100        # the extra ids a vocabulary keeps for sentinels (T5's "100extra")


def _counts(n: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
    """(noise tokens, noise spans) of a sequence of length n >= 2; every span needs a non-noise
    run before it."""
    noise = min(max(round(n * noise_density), 1), n - 1)
    spans = min(max(round(noise / mean_noise_span_length), 1), n - noise)
    return noise, spans


def _segment(rng: np.random.Generator, items: int, segments: int) -> np.ndarray:
    """Lengths of ``segments`` non-empty runs that split ``items`` at uniformly random places."""
    starts = np.zeros(items, np.int64)
    starts[rng.choice(items - 1, segments - 1, replace=False) + 1] = 1
    return np.bincount(np.cumsum(starts), minlength=segments)


def noise_mask(n: int, noise_density: float, mean_noise_span_length: float,
               rng: np.random.Generator) -> np.ndarray:
    """[n] bool, True where a token is noise: T5's random_spans_noise_mask."""
    if not 0 < noise_density < 1 or mean_noise_span_length < 1:
        raise ValueError(f"noise_density={noise_density} must be in (0, 1) and "
                         f"mean_noise_span_length={mean_noise_span_length} >= 1")
    length = max(n, 2)
    noise, spans = _counts(length, noise_density, mean_noise_span_length)
    noise_lengths = _segment(rng, noise, spans)
    keep_lengths = _segment(rng, length - noise, spans)
    runs = np.stack([keep_lengths, noise_lengths], axis=1).reshape(-1)
    return np.repeat(np.tile([False, True], spans), runs)[:n]


def _sentinel_spans(ids: np.ndarray, spans: np.ndarray, vocab_size: int) -> np.ndarray:
    """Each run of ``spans`` replaced by one sentinel, counted down from vocab_size - 1."""
    previous = np.concatenate([[False], spans[:-1]])
    first = spans & ~previous
    out = np.where(first, vocab_size - np.cumsum(first), ids)
    return out[~(spans & previous)].astype(np.int32)


def corrupt(ids, *, vocab_size: int, noise_density: float = 0.15,
            mean_noise_span_length: float = 3.0,
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets), int32, of the token ids ``ids`` (no EOS added)."""
    ids = np.asarray(ids, np.int64)
    mask = noise_mask(len(ids), noise_density, mean_noise_span_length, rng)
    spans = int(np.sum(mask & ~np.concatenate([[False], mask[:-1]])))
    if spans > NUM_SENTINELS:
        raise ValueError(f"{spans} noise spans need more than the {NUM_SENTINELS} sentinel ids; "
                         "corrupt shorter sequences (at most ~2,000 tokens at 0.15 / 3.0)")
    return (_sentinel_spans(ids, mask, vocab_size), _sentinel_spans(ids, ~mask, vocab_size))


def max_spans(n: int, noise_density: float = 0.15, mean_noise_span_length: float = 3.0) -> int:
    """The noise spans (so sentinels) a sequence of ``n`` tokens gets."""
    return _counts(max(n, 2), noise_density, mean_noise_span_length)[1]


def lengths(inputs_length: int, noise_density: float = 0.15,
            mean_noise_span_length: float = 3.0) -> tuple[int, int]:
    """(raw tokens, targets length): the longest raw length whose corrupted inputs plus EOS fit
    ``inputs_length``, and the length of its targets plus EOS (T5's random_spans_helper:
    512 -> (568, 114) at 0.15 / 3.0)."""
    def corrupted(n):        # the counts corrupt() makes (noise_mask's), plus each EOS
        noise, spans = _counts(max(n, 2), noise_density, mean_noise_span_length)
        return n - noise + spans + 1, noise + spans + 1
    n = 1
    while corrupted(n + 1)[0] <= inputs_length:
        n += 1
    return n, corrupted(n)[1]
