"""Pearson's chi-square test without scipy: the statistic and its p-value (upper tail).

The p-value is the regularized upper incomplete gamma function Q(df/2, x/2), by its series for
x < a + 1 and by Lentz's continued fraction otherwise (Numerical Recipes' gammq), to ~1e-12.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError("df must be >= 1")
    if x <= 0:
        return 1.0
    a, y = df / 2.0, x / 2.0
    lg = a * math.log(y) - y - math.lgamma(a)
    if y < a + 1:  # series for P(a, y)
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1
            term *= y / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(lg))
    tiny = 1e-300  # continued fraction for Q(a, y)
    b = y + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(lg) * h


def chi_square(observed: Mapping, expected_p: Mapping, n: int, min_expected: float = 5.0
               ) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) of observed counts against probabilities.

    Cells expected fewer than ``min_expected`` times are pooled into one cell; an observation in a
    cell of probability 0 makes the p-value 0 (the sampler emitted something it must never emit).
    """
    if any(expected_p.get(k, 0.0) <= 0.0 and v for k, v in observed.items()):
        return math.inf, 0, 0.0
    cells = sorted(expected_p, key=lambda k: expected_p[k])
    stat = 0.0
    pooled_o = pooled_e = 0.0
    bins = 0
    for k in cells:
        e = n * expected_p[k]
        o = observed.get(k, 0)
        if e < min_expected:
            pooled_o += o
            pooled_e += e
            continue
        stat += (o - e) ** 2 / e
        bins += 1
    if pooled_e > 0:
        stat += (pooled_o - pooled_e) ** 2 / pooled_e
        bins += 1
    df = max(bins - 1, 1)
    return stat, df, chi2_sf(stat, df)
