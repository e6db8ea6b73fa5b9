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


def positive_mean_ci95(values: Sequence[float]) -> tuple[float, float] | None:
    """95% interval of the mean of a positive quantity (throughput), on the log scale like
    ``ratio_of_means``: ``mean * exp(±t(0.975, n-1) * cv / sqrt(n))``, so it never reaches
    zero or below, however few and noisy the samples (the plain t interval of three samples
    spread 40-60% can). None below two samples or when any sample is not finite and positive."""
    if len(values) < 2 or any(not (math.isfinite(v) and v > 0) for v in values):
        return None
    m = mean(values)
    half = float(stdtrit(len(values) - 1, 0.975)) * math.sqrt(_rel_var_of_mean(values))
    lo, hi = m * math.exp(-min(half, 700.0)), m * math.exp(min(half, 700.0))
    return (lo, hi) if math.isfinite(hi) and lo > 0 else None
