"""The correctness decision on plain numbers."""

import math

from tilegym_hf_bench.tolerance import REL_ERR_FLOOR, verdict


def test_kernelized_within_tolerance_passes():
    v = verdict(0.012, 0.010, True)
    assert v.passed
    assert v.tolerance == 1.5 * 0.010 + REL_ERR_FLOOR


def test_kernelized_worse_than_tolerance_fails():
    v = verdict(0.02, 0.010, True)
    assert not v.passed
    assert "tolerance" in v.reason


def test_non_finite_kernel_logits_fail_even_with_small_error():
    assert not verdict(0.0, 0.01, False).passed
    assert not verdict(math.nan, 0.01, True).passed


def test_non_finite_baseline_cannot_pass():
    assert not verdict(0.01, math.inf, True).passed


def test_without_cutile_only_the_baseline_is_judged():
    v = verdict(None, 0.004, True)
    assert v.passed and v.tolerance is None
