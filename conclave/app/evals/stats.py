"""The few statistics an eval report needs, in plain Python (no numpy for five functions).

An eval has tens to hundreds of items, so every accuracy comes with its uncertainty, and a
council is compared with the best single member on the same items, pairwise:

- `wilson`: the Wilson score interval of an accuracy. Unlike the normal approximation it stays
  inside 0..1 and keeps close to its nominal coverage at the accuracies evals see (0.9 of 60).
- `paired_bootstrap`: the difference of two accuracies on the same items, with a percentile
  interval from resampling the items (each item's pair of outcomes kept together).
- `mcnemar_exact`: whether two strategies differ, from the items where exactly one was right.
- `fleiss_kappa`: how far the judges agree beyond chance.
- `percentile`: latency percentiles, as numpy's default (linear) computes them.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence

Z_95 = 1.959963984540054  # the standard normal's 97.5th percentile: a two-sided 95% interval


def wilson(successes: int, n: int, *, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval (low, high) of `successes` in `n`; (0.0, 1.0) when n is 0,
    where nothing is known. ValueError unless 0 <= successes <= n."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, not successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    spread = z * z / n
    centre = (p + spread / 2) / (1 + spread)
    half = z * math.sqrt(p * (1 - p) / n + spread / (4 * n)) / (1 + spread)
    # At 0 or n successes one bound is exactly 0 or 1; rounding must not move it off.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def paired_bootstrap(
    a: Sequence[bool], b: Sequence[bool], *, resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """(mean(a) - mean(b), low, high): the difference of two accuracies on the same items and
    its percentile interval at `level`, from `resamples` resamplings of the items with
    replacement. Deterministic for a seed. ValueError for lengths that differ, no items,
    fewer than 1 resample or a level outside (0, 1)."""
    n = _paired_length(a, b)
    if n == 0:
        raise ValueError("no pairs: the difference of two accuracies needs at least one item")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, not {resamples}")
    if not 0 < level < 1:
        raise ValueError(f"level must be between 0 and 1, not {level}")
    # Resampling items resamples their per-item differences (-1, 0 or 1): one draw per item.
    differences = [int(bool(x)) - int(bool(y)) for x, y in zip(a, b, strict=True)]
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(differences, k=n)) / n for _ in range(resamples))
    tail = (1 - level) / 2 * 100
    return sum(differences) / n, _interpolate(means, tail), _interpolate(means, 100 - tail)


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool]) -> float:
    """The two-sided exact McNemar p-value: of the items where exactly one of the two was right,
    how unlikely so lopsided a split is if each was equally likely to be the one. 1.0 when there
    is no such item. ValueError for lengths that differ."""
    _paired_length(a, b)
    only_a = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
    only_b = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
    discordant = only_a + only_b
    if discordant == 0:
        return 1.0
    tail = sum(math.comb(discordant, k) for k in range(min(only_a, only_b) + 1))
    return min(1.0, 2 * tail / (1 << discordant))  # int / int: correctly rounded, however large


def _paired_length(a: Sequence[bool], b: Sequence[bool]) -> int:
    if len(a) != len(b):
        raise ValueError(f"paired outcomes must be as many on each side, not {len(a)} and {len(b)}")
    return len(a)


def fleiss_kappa(ratings: Sequence[Sequence[str]]) -> float | None:
    """Fleiss' kappa of `ratings`, one row per subject holding the label each rater gave it.
    None where it is undefined: fewer than 2 subjects or 2 raters, or every label the same
    (agreement expected by chance is then 1). ValueError when rows hold different numbers of
    labels, or a row is a string rather than a list of labels."""
    rows = list(ratings)
    for index, row in enumerate(rows):
        if isinstance(row, str):
            raise ValueError(f"row {index} is the string {row!r}, not a list of labels")
    raters = len(rows[0]) if rows else 0
    for index, row in enumerate(rows):
        if len(row) != raters:
            raise ValueError(
                f"every subject needs {raters} labels (as row 0 has), but row {index} has {len(row)}"
            )
    if len(rows) < 2 or raters < 2:
        return None
    counts = [Counter(row) for row in rows]
    totals = Counter[str]()
    for count in counts:
        totals.update(count)
    if len(totals) < 2:
        return None
    labels = len(rows) * raters
    expected = sum((total / labels) ** 2 for total in totals.values())
    observed = sum(
        (sum(c * c for c in count.values()) - raters) / (raters * (raters - 1)) for count in counts
    ) / len(rows)
    return (observed - expected) / (1 - expected)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q`th percentile (0..100) of `values` by linear interpolation between the closest
    ranks, numpy's default; None for no values. ValueError for q outside 0..100."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be between 0 and 100, not {q}")
    return _interpolate(sorted(values), q) if values else None


def _interpolate(ordered: Sequence[float], q: float) -> float:
    """The `q`th percentile of `ordered`, sorted and not empty."""
    position = (len(ordered) - 1) * q / 100
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)
