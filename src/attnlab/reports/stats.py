"""Statistics over seeds: mean, standard deviation and a Student-t confidence interval."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (bisection on its CDF)."""
    if df < 1:
        raise ValueError(f"df={df} must be >= 1")

    def cdf(t: float) -> float:
        x = df / (df + t * t)
        tail = 0.5 * _incomplete_beta(df / 2, 0.5, x)
        return 1 - tail if t > 0 else tail

    low, high = -1e3, 1e3
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < p else (low, mid)
    return (low + high) / 2


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) by its continued fraction (Lentz's method)."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    if x > (a + 1) / (a + b + 2):
        return 1 - _incomplete_beta(b, a, 1 - x)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1 - x)
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):  # fmt: skip
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return math.exp(log_front) * f / a


@dataclass
class Stat:
    """Mean, standard deviation and 95% t-interval half-width over seeds (None with one seed)."""

    n: int
    mean: float
    std: float | None
    half_width: float | None


def stat(values: Sequence[float]) -> Stat:
    """The `Stat` of `values`; with a NaN or infinite value (a run that diverged) the mean is NaN or
    infinite and there is no standard deviation or interval."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2 or not all(map(math.isfinite, values)):
        return Stat(n, mean, None, None)
    std = statistics.stdev(values)
    return Stat(n, mean, std, t_quantile(0.975, n - 1) * std / math.sqrt(n))
