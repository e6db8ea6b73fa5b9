"""The correctness decision on plain numbers."""

import math

from tilegym_hf_bench.tolerance import (
    MAX_BASELINE_REL_ERR,
    REL_ERR_FLOOR,
    unusable_reference,
    verdict,
)


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


def test_a_reference_the_bf16_model_is_far_from_cannot_referee():
    """gemma3's preset once had its bf16 logits 0.93 from fp32: 1.5x that passes zeros (1.0)."""
    v = verdict(1.0, 0.93, True)
    assert not v.passed and v.tolerance is None
    assert "cannot referee" in v.reason and "0.93" in v.reason
    assert unusable_reference(MAX_BASELINE_REL_ERR) is None
    assert unusable_reference(MAX_BASELINE_REL_ERR * 1.01) is not None
    assert verdict(0.01, MAX_BASELINE_REL_ERR, True).passed
    assert verdict(None, 0.93, True).passed  # a baseline-only run checks no kernel
