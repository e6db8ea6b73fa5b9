"""Sequential paired sampling (``tilegym_bot.sequential``): the stopping rule on plain data."""

from __future__ import annotations

import pytest
from tilegym_bot import sequential as sq
from tilegym_bot.policy import decide, speedup_samples, throughput_ratio
from tilegym_bot.stats import RatioEstimate, ratio_of_means
from tilegym_hf_bench.metrics_schema import validation_errors

COST = sq.PairCost(fixed_s=100.0, per_run_s=2.0)  # a pair of 5 runs a side: 220 s


def _step(estimate, **kw):
    args = {
        "margin": 0.02,
        "pairs": 1,
        "last_runs": 5,
        "first_runs": 5,
        "elapsed_s": 220.0,
        "cost": COST,
    }
    return sq.next_step(estimate, **{**args, **kw})


def test_a_clear_keep_stops_after_one_pair():
    est = ratio_of_means([1.50, 1.51, 1.49, 1.50, 1.50], [1.40, 1.41, 1.39, 1.40, 1.40])
    step = _step(est)
    assert step.stop and step.stopped == sq.NOT_SLOWER
    assert "at or above it" in step.why


def test_a_clear_slowdown_stops_after_one_pair():
    est = ratio_of_means([1.30, 1.31, 1.29, 1.30, 1.30], [1.50, 1.51, 1.49, 1.50, 1.50])
    step = _step(est)
    assert step.stop and step.stopped == sq.SLOWER


def test_an_undecided_interval_asks_for_a_pair_with_growth_times_the_runs():
    est = ratio_of_means([1.40, 1.55, 1.45, 1.60, 1.35], [1.45, 1.50, 1.60, 1.40, 1.55])
    assert est.ci95[0] < 0.98 < est.ci95[1]
    assert sq.GROWTH == 8
    step = _step(est)  # 40 runs: 360 s of 680 left
    assert not step.stop and step.runs == 40
    step = _step(est, pairs=2, last_runs=40, elapsed_s=580.0)  # 320 left: 320 runs, ..., 20
    assert not step.stop and step.runs == 20


def test_the_next_pair_is_trimmed_to_the_budget_then_refused():
    est = RatioEstimate(0.99, (0.95, 1.03))
    # 900 - 500 = 400 s left: 80 runs (520 s) do not fit, 40 (360 s) do
    assert _step(est, pairs=2, last_runs=10, elapsed_s=500.0).runs == 40
    # 900 - 640 = 260 s left: 20 runs do not, 10 (240 s) do
    assert _step(est, pairs=2, last_runs=10, elapsed_s=640.0).runs == 10
    # 900 - 700 = 200 s left: not even the first pair's 5 runs (220 s)
    step = _step(est, pairs=2, last_runs=10, elapsed_s=700.0)
    assert step.stop and step.stopped == sq.BUDGET and "does not fit" in step.why


def test_a_slowdown_while_the_gpu_time_fell_gets_one_more_pair():
    est = RatioEstimate(0.90, (0.85, 0.95))
    assert not _step(est, gpu_fell=True).stop  # the first pair: the host, not the kernels?
    step = _step(est, gpu_fell=True, pairs=2, last_runs=10, elapsed_s=460.0)
    assert step.stop and step.stopped == sq.SLOWER


def test_no_estimate_or_no_model_stops():
    assert _step(None).stopped == sq.NO_INTERVAL
    est = RatioEstimate(0.99, (0.95, 1.03))
    assert _step(est, cost=None).stopped == sq.BUDGET
    assert _step(est, pairs=sq.MAX_PAIRS).stopped == sq.MAX
    assert _step(RatioEstimate(0.97, None), first_runs=1, last_runs=1).stopped == sq.NO_INTERVAL
    with pytest.raises(ValueError):
        _step(est, pairs=0)


def test_a_zero_budget_is_one_pair():
    est = RatioEstimate(0.99, (0.95, 1.03))
    assert _step(est, budget_s=0.0).stopped == sq.BUDGET


def test_pool_concatenates_the_runs_and_stays_schema_valid(make_metrics):
    a = make_metrics(interleaved=True)
    b = make_metrics(interleaved=True, cutile=(60.0, 61.0), baseline=(30.0, 30.5))
    pooled = sq.pool([a, b])
    assert validation_errors(pooled) == []
    assert pooled["workload"]["timed_runs"] == 7
    assert pooled["cutile"]["throughput"]["samples"] == [50.0, 51.0, 49.0, 50.5, 49.5, 60.0, 61.0]
    assert len(speedup_samples(pooled)) == 7
    assert sq.pool([a]) is a
    assert a["workload"]["timed_runs"] == 5  # inputs untouched
    c = make_metrics(interleaved=False)
    assert sq.pool([a, c])["cutile"]["throughput"]["interleaved"] is False


def test_pooled_samples_narrow_the_interval(make_metrics):
    """The same spread, three times the runs: the policy's interval shrinks around r."""
    base = make_metrics(commit="a" * 40, interleaved=True)
    head = make_metrics(interleaved=True, cutile=(48.0, 53.0, 47.0, 52.5, 49.5))
    one = throughput_ratio(base, head).estimate
    three = throughput_ratio(sq.pool([base] * 3), sq.pool([head] * 3)).estimate
    assert three.ratio == pytest.approx(one.ratio)
    assert (three.ci95[1] - three.ci95[0]) < 0.6 * (one.ci95[1] - one.ci95[0])


def test_cost_model_from_jobs(make_metrics):
    doc = make_metrics()  # 128 tokens at ~50 (cuTile) and ~25 (PyTorch) tok/s: 7.68 s a run
    one = sq.per_run_seconds(doc)
    assert one == pytest.approx(128 / 50.0 + 128 / 25.0)
    cost = sq.cost_of([(doc, 120.0), (doc, 100.0)])
    assert cost.per_run_s == pytest.approx(one)
    assert cost.fixed_s == pytest.approx(120.0 - 5 * one)  # the slower job: a limit
    assert sq.cost_of([]) is None


def test_the_decision_says_how_many_pairs_and_why_it_stopped(make_metrics):
    base = make_metrics(commit="a" * 40, interleaved=True)
    head = make_metrics(coverage=55.0, interleaved=True)
    record = sq.sampling_record(
        pairs=3, runs=(35, 35), stopped=sq.NOT_SLOWER, why="w", seconds=700.04, budget_s=900.0
    )
    decision = decide(base, head, sampling=record)
    assert decision.to_json()["sampling"] == {
        "pairs": 3,
        "runs": {"base": 35, "head": 35},
        "stopped": "decisive-not-slower",
        "why": "w",
        "seconds": 700.0,
        "budget_s": 900.0,
    }
    assert decision.reasons[-1].startswith("sampling: 3 base/head pair(s), 35 base and 35 head")
    assert decide(base, head).to_json()["sampling"] is None
