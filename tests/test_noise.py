"""The one seed-noise rule (switchzoo.noise): a paired t-test over the same-seed gaps, one
common seed held to the study's largest seed sd, and an estimate that settles as seeds grow."""
import pytest

from switchzoo import noise


def test_the_noise_rule_judges_same_seed_gaps_like_for_like():
    # both models move 0.5 with the seed, the gap only 0.04 or so: paired, a paired t-test over
    # the gaps. Two seeds (1 degree of freedom): sd 0.0283, half-width 12.71 x 0.0283 / sqrt(2)
    # = 0.2541 > 0.12, within; a third seed's gap 0.11 (2 df: 4.30 x 0.0208 / sqrt(3) = 0.0517)
    # puts 0.1167 beyond it
    paired = noise.compare({0: 3.0, 1: 3.5}, {0: 3.1, 1: 3.64})
    assert paired["gaps"] == [0.1, 0.14] and paired["margin"] == 0.12
    assert paired["noise"] == 0.2541 and paired["noise_from"] == "paired" and paired["df"] == 1
    assert paired["better"] and not paired["beyond_noise"] and paired["ratio"] == 0.5
    three = noise.compare({0: 3.0, 1: 3.5, 2: 3.2}, {0: 3.1, 1: 3.64, 2: 3.31})
    assert three["margin"] == 0.1167 and three["noise"] == 0.0517 and three["df"] == 2
    assert three["beyond_noise"] and three["ratio"] == 2.3
    # like for like: only seed 0 is common; the two-seed mean of b (2.355) would flip the sign.
    # One gap: held to the reference (sd 0.02, 1 df): 12.71 x sqrt(2) x 0.02 = 0.3594
    one = noise.compare({0: 2.40}, {0: 2.41, 1: 2.30}, ref=(0.02, 1))
    assert one["seeds"] == [0] and one["margin"] == 0.01 and one["better"] is True
    assert one["noise"] == 0.3594 and one["noise_from"] == "reference"
    assert one["beyond_noise"] is False and noise.verdict(one) == "better, within noise"
    # beyond means more than the half-width: 0.5 against 12.71 x sqrt(2) x sd at sd 0.0278
    # (0.4995) and 0.0279 (0.5013)
    assert noise.compare({0: 1.0}, {0: 1.5}, ref=(0.0278, 1))["beyond_noise"] is True
    assert noise.compare({0: 1.0}, {0: 1.5}, ref=(0.0279, 1))["beyond_noise"] is False
    assert noise.compare({0: 1.0}, {0: 1.5})["beyond_noise"] is None      # nothing to judge by
    assert noise.verdict(noise.compare({0: 1.0}, {1: 1.5})) == "untested (no common seed)"
    assert noise.compare({0: 2.0}, {0: 1.0}, ref=(0.1, 1), higher_is_better=True)["margin"] == 1.0
    # two equal gaps (lm_claims' top2_8_cf2.0 against dense): no sd finer than the values' 4
    # decimals, so the noise is 12.71 x 1e-4 / sqrt(2) = 0.0009, and the gap is far beyond it
    equal = noise.compare({0: 4.4974, 1: 4.4862}, {0: 4.6264, 1: 4.6152})
    assert equal["gaps"] == [0.129, 0.129] and equal["noise"] == 0.0009
    assert equal["beyond_noise"] is True
    # ... but a gap finer than the values' 4 decimals is not beyond it
    tiny = noise.compare({0: 1.00000, 1: 2.00000}, {0: 1.00003, 1: 2.00003})
    assert tiny["beyond_noise"] is False and noise.verdict(tiny) == "better, within noise"
    assert noise.reference({"a": {0: 1.0, 1: 1.3}, "b": {0: 2.0, 1: 2.1}, "c": {0: 9.0}}) \
        == pytest.approx((0.3 / 2 ** .5, 1))


def test_the_noise_estimate_settles_as_seeds_are_added():
    """The gaps' range grows with every seed added, so a range-based noise jumped (the review:
    20.5x the noise on seeds 0-1, 1.9x on 0-2). The sd's estimate does not grow with n, and
    the standard error shrinks as 1/sqrt(n): over 1,000 draws of gaps ~ N(0.1, 0.05) the
    median paired noise falls at every seed added, and its spread over draws narrows."""
    import numpy as np
    rng = np.random.default_rng(0)
    gaps = rng.normal(0.1, 0.05, size=(1000, 8))
    medians = []
    for n in range(2, 9):
        noises = [noise.compare(dict(enumerate(g[:n])), {i: 0.0 for i in range(n)},
                                higher_is_better=True)["noise"] for g in gaps]
        medians.append(float(np.median(noises)))
    assert all(a > b for a, b in zip(medians, medians[1:]))
    assert medians[-1] == pytest.approx(2.365 * 0.05 / 8 ** .5, rel=0.15)   # t(0.975, 7) x SE
    # the same gaps under a published paired verdict: rejudge reads only the recorded gaps
    old = {"seeds": [0, 1], "gaps": [0.1, 0.14], "margin": 0.12, "noise": 0.04,
           "noise_from": "paired", "ratio": 3.0, "better": True, "beyond_noise": True,
           "verdict": "better, beyond noise", "runs": ["a", "b"]}
    again = noise.rejudge(old)
    assert again["verdict"] == "better, within noise" and again["noise"] == 0.2541
    assert again["runs"] == ["a", "b"] and again["df"] == 1
