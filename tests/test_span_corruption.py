"""T5 span corruption: counts as T5's random_spans_noise_mask, sentinels from the top of the
vocabulary, inputs and targets that interleave back into the original, boundaries uniformly
random, and T5's length arithmetic."""
import collections

import numpy as np
import pytest

from switchzoo.data import span_corruption as sc

V = 1000


def rebuild(inputs, targets):
    """The original sequence: each sentinel of the inputs replaced by what follows it in the
    targets (up to the next sentinel)."""
    pieces, current = {}, None
    for t in targets:
        if t >= V - sc.NUM_SENTINELS:
            current = int(t)
            pieces[current] = []
        else:
            pieces[current].append(int(t))
    out = []
    for t in inputs:
        out += pieces[int(t)] if t >= V - sc.NUM_SENTINELS else [int(t)]
    return out


@pytest.mark.parametrize("density, mean", [(0.15, 3.0), (0.5, 1.0), (0.3, 8.0)])
def test_counts_sentinels_and_the_round_trip(density, mean):
    rng = np.random.default_rng(0)
    for n in list(range(2, 80)) + [568] * (density == 0.15):
        ids = rng.integers(1, V - sc.NUM_SENTINELS, n)
        mask = sc.noise_mask(n, density, mean, rng)
        noise = min(max(round(n * density), 1), n - 1)
        spans = min(max(round(noise / mean), 1), n - noise)
        starts = mask & ~np.concatenate([[False], mask[:-1]])
        assert mask.sum() == noise and starts.sum() == spans and not mask[0], n
        inputs, targets = sc.corrupt(ids, vocab_size=V, noise_density=density,
                                     mean_noise_span_length=mean, rng=np.random.default_rng(n))
        assert inputs.dtype == targets.dtype == np.int32
        assert len(inputs) == n - noise + spans and len(targets) == noise + spans
        sentinels = [t for t in inputs if t >= V - sc.NUM_SENTINELS]
        assert sentinels == list(range(V - 1, V - 1 - spans, -1))      # <extra_id_0> = V - 1
        assert [t for t in targets if t >= V - sc.NUM_SENTINELS] == sentinels
        assert targets[0] == V - 1                 # the targets open with the first sentinel
        assert rebuild(inputs, targets) == ids.tolist()


def test_span_boundaries_are_uniformly_random():
    # n=10 at 0.3 / 1.5: 3 noise tokens in 2 spans, 7 kept in 2 runs -> 2 x 6 = 12 masks, each
    # equally likely.
    rng = np.random.default_rng(1)
    seen = collections.Counter(sc.noise_mask(10, 0.3, 1.5, rng).tobytes() for _ in range(6000))
    assert len(seen) == 12
    assert max(seen.values()) < 1.2 * 500 and min(seen.values()) > 0.8 * 500


def test_t5_length_arithmetic():
    assert sc.lengths(512) == (568, 114)        # T5 / Switch: 512 inputs, 114 targets
    for inputs_length in (64, 128, 512, 1024):
        raw, targets_length = sc.lengths(inputs_length)
        inputs, targets = sc.corrupt(np.arange(1, raw + 1), vocab_size=V * 10,
                                     rng=np.random.default_rng(0))
        assert (len(inputs) + 1, len(targets) + 1) == (inputs_length, targets_length)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="noise_density=1.5 must be in"):
        sc.corrupt([1, 2, 3], vocab_size=V, noise_density=1.5, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="more than the 100 sentinel ids"):
        sc.corrupt(np.arange(1, 5000), vocab_size=10_000, rng=np.random.default_rng(0))
