"""The parity check itself: CPU tests that it fails on wrong outputs (zeros, NaN, noise)."""

import pytest
import torch

from tilegym.ops.testing import REL_TOL, assert_close_rel, rel_err


def test_zero_output_fails():
    ref = torch.randn(64, 128)
    with pytest.raises(AssertionError, match="relative error"):
        assert_close_rel(torch.zeros_like(ref, dtype=torch.bfloat16), ref)


def test_nan_output_fails():
    ref = torch.randn(8, 8)
    out = ref.clone()
    out[3, 3] = float("nan")
    assert rel_err(out, ref) == float("inf")
    with pytest.raises(AssertionError):
        assert_close_rel(out, ref, tol=1.0)


def test_bf16_rounding_passes_and_larger_noise_fails():
    ref = torch.randn(256, 256)
    assert_close_rel(ref.to(torch.bfloat16), ref)
    noisy = (ref + 0.05 * torch.randn_like(ref)).to(torch.bfloat16)
    with pytest.raises(AssertionError):
        assert_close_rel(noisy, ref)


def test_shape_mismatch_fails():
    with pytest.raises(AssertionError, match="shape"):
        rel_err(torch.zeros(2, 3), torch.zeros(3, 2))


def test_tolerances_ordered_by_precision():
    assert REL_TOL[torch.float32] < REL_TOL[torch.float16] < REL_TOL[torch.bfloat16]
