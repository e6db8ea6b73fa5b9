"""Confidence interval for a ratio of two means from few, noisy, independent samples.

Method: delta method on the log ratio with Welch–Satterthwaite degrees of freedom and Student t
quantiles. For r = mean(a) / mean(b), ``log r`` has standard error
``sqrt(cv_a**2 / n_a + cv_b**2 / n_b)`` (cv = sample std / mean), and the interval
``r * exp(±t(0.975, df) * se)`` is asymmetric around r as a ratio should be.

Why not a bootstrap: with the ~10 runs a side that a GPU job affords (and 2–5 on a quick run) a
percentile bootstrap is too narrow (it under-covers at small n) and depends on a seed, while the t
quantile widens the interval exactly where few samples warrant it, and is deterministic. Why Welch:
the two sides come from different jobs (possibly different GPUs' noise), so their variances are
not assumed equal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy.special import stdtrit  # Student t quantile; lighter to import than scipy.stats


@dataclass(frozen=True)
class RatioEstimate:
    ratio: float
    ci95: tuple[float, float] | None  # None when a side has fewer than two samples


def mean(values: Sequence[float]) -> float:
    """Mean of finite values that cannot overflow (each value is divided first)."""
    n = len(values)
    return math.fsum(v / n for v in values)


def _rel_var_of_mean(values: Sequence[float]) -> float:
    """Squared coefficient of variation of the sample mean, var(x) / (n * mean(x)**2), computed
    on x / mean(x) so that no intermediate overflows."""
    m, n = mean(values), len(values)
    return math.fsum((v / m - 1.0) ** 2 for v in values) / (n - 1) / n


def ratio_of_means(a: Sequence[float], b: Sequence[float]) -> RatioEstimate:
    """mean(a) / mean(b) and its 95% CI; samples finite and positive, each side non-empty.
    ValueError when the inputs or the result are not finite positive numbers."""
    if not a or not b:
        raise ValueError("both sides need at least one sample")
    if any(not (math.isfinite(v) and v > 0) for v in (*a, *b)):
        raise ValueError("samples must be finite and positive")
    ma, mb = mean(a), mean(b)
    if not (ma > 0 and mb > 0 and math.isfinite(ratio := ma / mb) and ratio > 0):
        raise ValueError(f"the ratio of means {ma!r} / {mb!r} is not a finite positive number")
    if len(a) < 2 or len(b) < 2:
        return RatioEstimate(ratio, None)
    va, vb = _rel_var_of_mean(a), _rel_var_of_mean(b)
    se = math.sqrt(va + vb)
    if se == 0.0:
        return RatioEstimate(ratio, (ratio, ratio))
    # Welch–Satterthwaite; a zero-variance side contributes no term.
    denom = sum(v * v / (len(s) - 1) for v, s in ((va, a), (vb, b)) if v > 0)
    df = (va + vb) ** 2 / denom
    half = float(stdtrit(df, 0.975)) * se
    lo, hi = ratio * math.exp(-min(half, 700.0)), ratio * math.exp(min(half, 700.0))
    if not (math.isfinite(hi) and lo > 0):
        raise ValueError("the confidence interval of the ratio is not finite")
    return RatioEstimate(ratio, (lo, hi))


def mean_ci95(values: Sequence[float]) -> tuple[float, float] | None:
    """Student t 95% interval of the mean of ``values`` (None below two finite samples)."""
    if len(values) < 2 or not all(math.isfinite(v) for v in values):
        return None
    m, n = mean(values), len(values)
    scaled = [(v - m) / n for v in values]  # x*x (unlike x**2) gives inf instead of raising
    sd = math.sqrt(math.fsum(x * x for x in scaled) * n * n / (n - 1))
    half = float(stdtrit(n - 1, 0.975)) * sd / math.sqrt(n)
    return (m - half, m + half) if math.isfinite(half) else None
