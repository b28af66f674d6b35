"""The one seed-noise rule the claims studies judge a difference by (docs/experiments.md).

A comparison of two models (``a`` better than ``b`` when ``a``'s value is lower, e.g. a final
held-out loss) is read like for like: only the seeds both ran count, and the margin is the
mean over those seeds of the same-seed gap b - a (positive: ``a`` is better). A seed changes
the initialisation and the data order of both runs alike, so the gap of one seed cancels what
the seed does to both models; its noise is measured on the gaps themselves:

- two or more common seeds: the spread (max - min) of the same-seed gaps (``paired``);
- one common seed: ``reference``, the largest seed spread (max - min over seeds) of a single
  model's value that the study measured (``reference``): one gap cannot show how much of its
  seed cancels, so it is held to how far one model moves with the seed;
- no reference either: no verdict on noise (None).

A margin is beyond noise when |margin| > NOISE x noise. Pure Python: switchzoo.tables and
experiments/ both judge with it.
"""
from __future__ import annotations

import statistics
from typing import Mapping

NOISE = 2.0
RESOLUTION = 1e-4          # the values' recorded precision: no noise is measured finer
RULE = ("like for like over the seeds both ran; margin: the mean same-seed gap; noise: the "
        "spread of the same-seed gaps (two or more seeds), else the study's largest seed spread "
        "of one model; beyond noise: |margin| > 2 x noise (a noise below the values' recorded "
        "1e-4 counts as 1e-4)")


def spread(values) -> float | None:
    """max - min, None for fewer than two values (nothing measured)."""
    values = list(values)
    return max(values) - min(values) if len(values) > 1 else None


def reference(groups: Mapping[str, Mapping[int, float]]) -> float | None:
    """The largest single-model seed spread over ``groups`` ({model: {seed: value}}); None
    where no model ran two seeds."""
    spreads = [s for s in (spread(g.values()) for g in groups.values()) if s is not None]
    return max(spreads) if spreads else None


def compare(a: Mapping[int, float], b: Mapping[int, float], ref: float | None = None,
            higher_is_better: bool = False) -> dict:
    """``a`` against ``b`` ({seed: value}) under the rule above: {"seeds" (common, sorted),
    "gaps" (per seed, positive where ``a`` is better), "margin" (their mean), "noise", "noise_from"
    ("paired", "reference" or None), "ratio" (|margin| / noise), "better" (margin > 0),
    "beyond_noise" (None: no common seed or no noise estimate)}. Values rounded to 4 decimals."""
    seeds = sorted(set(a) & set(b))
    out = {"seeds": seeds, "gaps": [], "margin": None, "noise": None, "noise_from": None,
           "ratio": None, "better": None, "beyond_noise": None}
    if not seeds:
        return out
    sign = 1.0 if higher_is_better else -1.0
    gaps = [sign * (a[s] - b[s]) for s in seeds]
    margin = statistics.fmean(gaps)
    noise, source = (spread(gaps), "paired") if len(gaps) > 1 else (ref, "reference")
    out.update(gaps=[round(g, 4) for g in gaps], margin=round(margin, 4), better=margin > 0)
    if noise is None:
        return out
    # the values are recorded to 4 decimals: a spread below that (two equal gaps) is no
    # measurement of noise finer than it, so the ratio is left out rather than ~1e14, and a
    # margin is judged against that resolution: gaps of 3e-5 are not "beyond" a noise of 0
    noise = round(noise, 4)
    out.update(noise=noise, noise_from=source,
               ratio=round(abs(margin) / noise, 1) if noise > 0 else None,
               beyond_noise=abs(margin) > NOISE * max(noise, RESOLUTION))
    return out


def verdict(c: dict) -> str:
    """'better' / 'worse' with 'beyond noise' / 'within noise' / 'no noise estimate' (or
    'untested' without a common seed): the words the docs use for ``compare``'s result."""
    if c["better"] is None:
        return "untested (no common seed)"
    side = "better" if c["better"] else "worse"
    if c["beyond_noise"] is None:
        return f"{side}, no noise estimate"
    return f"{side}, {'beyond' if c['beyond_noise'] else 'within'} noise"
