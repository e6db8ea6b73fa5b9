"""Statistics of timing samples against textbook values."""

import math

import pytest
from tilegym_hf_bench.stats import (
    first_run_outlier,
    lag1_autocorrelation,
    settled,
    student_t_central_prob,
    summarize,
    t_critical,
)


@pytest.mark.parametrize(
    ("df", "expected"),
    [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (9, 2.2622), (29, 2.0452), (100, 1.9840)],
)
def test_t_critical_matches_tables(df, expected):
    assert t_critical(0.95, df) == pytest.approx(expected, abs=1e-4)


def test_t_distribution_limits():
    assert student_t_central_prob(0.0, 5) == 0.0
    assert student_t_central_prob(1e6, 7) == pytest.approx(1.0, abs=1e-9)
    # df=1 is Cauchy: P(|T| <= 1) = 1/2
    assert student_t_central_prob(1.0, 1) == pytest.approx(0.5)


def test_summarize_mean_std_ci():
    s = summarize([10.0, 12.0, 14.0, 16.0])
    assert s.mean == 13.0
    assert s.std == pytest.approx(math.sqrt(20 / 3))
    half = t_critical(0.95, 3) * s.std / 13.0 / 2
    assert s.ci95 == pytest.approx((13.0 * math.exp(-half), 13.0 * math.exp(half)))
    mixed = summarize([-1.0, 1.0, 3.0])  # not all positive: the plain t interval
    plain = t_critical(0.95, 2) * 2.0 / math.sqrt(3)
    assert mixed.ci95 == pytest.approx((1.0 - plain, 1.0 + plain))


def test_summarize_interval_of_two_noisy_runs_stays_positive():
    """The printed interval of 82 and 53 tok/s was [-120, 254]: a throughput is never <= 0."""
    s = summarize([82.09, 52.66])
    assert 0 < s.ci95[0] < s.mean < s.ci95[1]
    assert s.ci95[0] * s.ci95[1] == pytest.approx(s.mean**2)


def test_summarize_small_samples():
    assert summarize([]).mean is None
    one = summarize([5.0])
    assert (one.mean, one.std, one.ci95) == (5.0, None, None)


def test_first_run_outlier_only_flags_a_slow_first_run():
    steady = [30.0, 31.0, 29.5, 30.5, 30.2]
    assert not first_run_outlier(steady)
    assert first_run_outlier([12.0, 31.0, 29.5, 30.5, 30.2])
    assert not first_run_outlier([45.0, 31.0, 29.5, 30.5, 30.2])
    assert not first_run_outlier([1.0, 2.0])


def test_warmup_settles_when_consecutive_runs_agree():
    assert settled([], 0)
    assert not settled([5.0], 1)
    assert not settled([5.0, 1.0], 2)
    assert settled([5.0, 1.0, 1.05], 2)
    assert not settled([5.0, 1.0, 1.05], 4)


def test_lag1_autocorrelation_tells_alternation_from_drift():
    assert lag1_autocorrelation([248.0, 205.0] * 5) == pytest.approx(-0.9)
    assert lag1_autocorrelation([float(x) for x in range(10)]) == pytest.approx(0.7)
    assert lag1_autocorrelation([1.0, 2.0]) is None
    assert lag1_autocorrelation([3.0, 3.0, 3.0]) is None
