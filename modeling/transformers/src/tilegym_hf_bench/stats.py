"""Summary statistics of timing samples: mean, sample std, Student-t 95% interval.

Pure Python on purpose (no scipy on the GPU host): the two-sided t critical value is found by
bisection on the exact Student-t distribution function for integer degrees of freedom
(Abramowitz & Stegun 26.7.3-4, a finite trigonometric series).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


def student_t_central_prob(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` (a positive integer) degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    cos_t, sin_t = math.cos(theta), math.sin(theta)
    if df % 2 == 1:
        series, term = 0.0, cos_t
        for k in range(1, (df - 1) // 2 + 1):
            if k > 1:
                term *= cos_t * cos_t * (2 * k - 2) / (2 * k - 1)
            series += term
        return (2.0 / math.pi) * (theta + sin_t * series)
    series, term = 1.0, 1.0
    for k in range(1, (df - 2) // 2 + 1):
        term *= cos_t * cos_t * (2 * k - 1) / (2 * k)
        series += term
    return sin_t * series


def t_critical(confidence: float, df: int) -> float:
    """The t with P(|T| <= t) = ``confidence`` (e.g. 0.95 -> 2.262 for df = 9)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    lo, hi = 0.0, 1.0
    while student_t_central_prob(hi, df) < confidence:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if student_t_central_prob(mid, df) < confidence:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


@dataclass(frozen=True)
class Summary:
    """mean, sample std and 95% CI of the mean; std and ci95 are None below two samples."""

    n: int
    mean: float | None
    std: float | None
    ci95: tuple[float, float] | None


def summarize(samples: list[float]) -> Summary:
    """Positive samples (throughput, times) get their interval on the log scale,
    ``mean * exp(±t * cv / sqrt(n))``, as the bot's ``positive_mean_ci95``: it never reaches
    zero or below however few and noisy the samples (two runs 40% apart give a plain t
    interval of [-120, 254] tok/s); other samples get the plain Student-t interval."""
    n = len(samples)
    if n == 0:
        return Summary(0, None, None, None)
    mean = statistics.fmean(samples)
    if n == 1:
        return Summary(1, mean, None, None)
    std = statistics.stdev(samples)
    t = t_critical(0.95, n - 1)
    if all(math.isfinite(v) and v > 0 for v in samples):
        half = min(t * std / mean / math.sqrt(n), 700.0)
        return Summary(n, mean, std, (mean * math.exp(-half), mean * math.exp(half)))
    half = t * std / math.sqrt(n)
    return Summary(n, mean, std, (mean - half, mean + half))


def first_run_outlier(samples: list[float], rel_tol: float = 0.15) -> bool:
    """True when the first throughput sample lies below the median of the others by more than
    ``rel_tol`` (and 3 robust sigmas): the sign that warm-up did not remove compile cost."""
    if len(samples) < 3:
        return False
    rest = samples[1:]
    median = statistics.median(rest)
    mad = statistics.median(abs(x - median) for x in rest)
    spread = max(rel_tol * abs(median), 3.0 * 1.4826 * mad)
    return median - samples[0] > spread


def settled(times: list[float], min_runs: int, rel_tol: float = 0.10) -> bool:
    """Warm-up is over once ``min_runs`` ran and the last run is within ``rel_tol`` of the one
    before it (the compile and autotune cost of the first runs is gone). ``min_runs == 0``
    asks for no warm-up at all; otherwise two runs are needed to see that it settled."""
    if min_runs == 0:
        return True
    if len(times) < max(min_runs, 2):
        return False
    return abs(times[-1] - times[-2]) <= rel_tol * times[-2]


def lag1_autocorrelation(samples: list[float]) -> float | None:
    """Correlation of each sample with the next (None below three samples or with no spread).

    Near -1: the runs alternate between two levels (a phase that flips every run); near +1:
    slow drift; near 0: independent noise, which only more runs average out."""
    n = len(samples)
    if n < 3:
        return None
    mean = statistics.fmean(samples)
    dev = [x - mean for x in samples]
    var = sum(d * d for d in dev)
    if var == 0.0:
        return None
    return sum(dev[i] * dev[i + 1] for i in range(n - 1)) / var
