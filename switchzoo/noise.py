"""The one seed-noise rule the claims studies judge a difference by (docs/experiments.md).

A comparison of two models (``a`` better than ``b`` when ``a``'s value is lower, e.g. a final
held-out loss) is read like for like: only the seeds both ran count, and the margin is the
mean over those seeds of the same-seed gap b - a (positive: ``a`` is better). A seed changes
the initialisation and the data order of both runs alike, so the gap of one seed cancels what
the seed does to both models. The noise is the half-width of the margin's 95% confidence
interval, a paired t-test (two-sided, 5%):

- n >= 2 common seeds (``paired``): t(0.975, n - 1) x sd(gaps) / sqrt(n), with n - 1 degrees
  of freedom. Unlike the gaps' range, the standard deviation does not grow with every seed
  added, and the t quantile prices how few seeds there are (12.7 at 1 degree of freedom,
  4.3 at 2, 2.0 at 60);
- one common seed (``reference``): one gap shows nothing of its own spread, so it is held to
  the study's most seed-sensitive model (``reference``: the largest sample sd of one model's
  value over its seeds, with its degrees of freedom): t(0.975, df) x sqrt(2) x sd, the spread
  of a difference of two such runs;
- no reference either: no verdict on noise (None).

A margin is beyond noise when |margin| > noise. Values are recorded to 4 decimals, so no sd
is taken finer than RESOLUTION.
"""
from __future__ import annotations

import functools
import math
import statistics
from typing import Mapping

RESOLUTION = 1e-4          # the values' recorded precision: no sd is measured finer
LEVEL = 0.95               # two-sided confidence of the interval the noise is the half of
RULE = ("like for like over the seeds both ran; margin: the mean same-seed gap; noise: the "
        "half-width of its 95% confidence interval, a paired t-test: t(0.975, n-1) x sd(gaps) "
        "/ sqrt(n) over n >= 2 seeds (n-1 degrees of freedom), else t(0.975, df) x sqrt(2) x "
        "the study's largest seed sd of one model; beyond noise: |margin| > noise (no sd below "
        "the values' recorded 1e-4)")


@functools.lru_cache(maxsize=None)
def critical(df: int) -> float:
    """t(0.975, df): the two-sided 95% quantile of Student's t with ``df`` degrees of freedom."""
    from scipy import stats            # only when a verdict is judged (import ~0.3 s)
    return float(stats.t.ppf(0.5 + LEVEL / 2, df))


def spread(values) -> float | None:
    """max - min, None for fewer than two values (nothing measured)."""
    values = list(values)
    return max(values) - min(values) if len(values) > 1 else None


def sd(values) -> float | None:
    """The sample standard deviation (n - 1), None for fewer than two values."""
    values = list(values)
    return statistics.stdev(values) if len(values) > 1 else None


def reference(groups: Mapping[str, Mapping[int, float]]) -> tuple[float, int] | None:
    """(sd, degrees of freedom) of the most seed-sensitive model in ``groups`` ({model: {seed:
    value}}); None where no model ran two seeds."""
    found = [(sd(g.values()), len(g) - 1) for g in groups.values() if len(g) > 1]
    return max(found) if found else None


def compare(a: Mapping[int, float], b: Mapping[int, float],
            ref: tuple[float, int] | None = None, higher_is_better: bool = False) -> dict:
    """``a`` against ``b`` ({seed: value}) under the rule above: {"seeds" (common, sorted),
    "gaps" (per seed, positive where ``a`` is better), "margin" (their mean), "noise",
    "noise_from" ("paired", "reference" or None), "df" (the noise's degrees of freedom),
    "ratio" (|margin| / noise: beyond noise above 1), "better" (margin > 0), "beyond_noise"
    (None: no common seed or no noise estimate)}. Values rounded to 4 decimals."""
    seeds = sorted(set(a) & set(b))
    out = {"seeds": seeds, "gaps": [], "margin": None, "noise": None, "noise_from": None,
           "df": None, "ratio": None, "better": None, "beyond_noise": None}
    if not seeds:
        return out
    sign = 1.0 if higher_is_better else -1.0
    gaps = [sign * (a[s] - b[s]) for s in seeds]
    margin = statistics.fmean(gaps)
    out.update(gaps=[round(g, 4) for g in gaps], margin=round(margin, 4), better=margin > 0)
    if len(gaps) > 1:
        df, source = len(gaps) - 1, "paired"
        scale = max(sd(gaps), RESOLUTION) / math.sqrt(len(gaps))
    elif ref is not None:
        (ref_sd, df), source = ref, "reference"
        scale = math.sqrt(2) * max(ref_sd, RESOLUTION)
    else:
        return out
    noise = critical(df) * scale
    out.update(noise=round(noise, 4), noise_from=source, df=df,
               ratio=round(abs(margin) / noise, 1), beyond_noise=abs(margin) > noise)
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


def rejudge(c: dict) -> dict:
    """A published paired ``compare`` result judged again from its recorded gaps (the runs'
    values are not needed: the gaps and their count are the paired rule's whole input)."""
    if len(c.get("gaps") or ()) < 2:
        return c
    fresh = compare(dict(enumerate(c["gaps"])), {i: 0.0 for i in range(len(c["gaps"]))},
                    higher_is_better=True)
    kept = {k: v for k, v in c.items() if k not in fresh or k in ("seeds", "gaps", "margin")}
    out = {**fresh, **kept}
    if "verdict" in c:
        out["verdict"] = verdict(out)
    return out
