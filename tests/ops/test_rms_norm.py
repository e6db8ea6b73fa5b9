"""GPU parity of RMSNorm and fused add+RMSNorm against fp32 references."""

import pytest
import torch

from tilegym.ops.testing import REL_TOL, assert_close_rel, rel_err

pytestmark = pytest.mark.gpu

SHAPES = [(1, 64), (3, 1000), (7, 3, 1024), (5, 2048), (8, 4096), (2, 8192), (33, 4097), (130, 128)]
DTYPES = [torch.bfloat16, torch.float16]


def _inputs(shape, dtype, gen):
    x = torch.randn(shape, device="cuda", generator=gen).to(dtype) * 3
    w = (1 + 0.5 * torch.randn(shape[-1], device="cuda", generator=gen)).to(dtype)
    return x, w


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm(shape, dtype, gen, poison_empty):
    from tilegym.ops.rms_norm import rms_norm, rms_norm_reference

    x, w = _inputs(shape, dtype, gen)
    out = rms_norm(x, w, 1e-6)
    assert out.shape == x.shape and out.dtype == dtype
    assert_close_rel(out, rms_norm_reference(x.float(), w.float(), 1e-6))
    # matches the PyTorch module in its own dtype at least as tightly as fp32 does
    assert rel_err(out, rms_norm_reference(x, w, 1e-6)) <= REL_TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_add_rms_norm(shape, dtype, gen, poison_empty):
    from tilegym.ops.rms_norm import add_rms_norm, rms_norm_reference

    x, w = _inputs(shape, dtype, gen)
    r = torch.randn(shape, device="cuda", generator=gen).to(dtype)
    total, normed = add_rms_norm(x, r, w, 1e-5)
    ref_total = x.float() + r.float()
    assert_close_rel(total, ref_total)
    assert_close_rel(normed, rms_norm_reference(ref_total, w.float(), 1e-5))


def test_fp32_weight_promotes_like_torch(gen, poison_empty):
    from tilegym.ops.rms_norm import rms_norm, rms_norm_reference

    x = torch.randn(4, 1024, device="cuda", generator=gen).to(torch.bfloat16)
    w = torch.randn(1024, device="cuda", generator=gen)
    out = rms_norm(x, w, 1e-6)
    ref = rms_norm_reference(x, w, 1e-6)
    assert out.dtype == ref.dtype == torch.float32
    assert_close_rel(out, ref, tol=1e-5)


def test_zero_output_fails_against_real_reference(gen):
    from tilegym.ops.rms_norm import rms_norm_reference

    x, w = _inputs((16, 1024), torch.bfloat16, gen)
    with pytest.raises(AssertionError):
        assert_close_rel(torch.zeros_like(x), rms_norm_reference(x.float(), w.float(), 1e-6))


def test_deterministic(gen):
    from tilegym.ops.rms_norm import add_rms_norm

    x, w = _inputs((64, 2048), torch.bfloat16, gen)
    r = torch.randn_like(x)
    a = add_rms_norm(x, r, w, 1e-6)
    b = add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("tile_elems", [1024, 32768])
def test_other_row_tilings(tile_elems, gen, poison_empty):
    """The benchmark sweep's tilings (1 and 32 rows per block) are exact too, tails included."""
    from tilegym.ops.rms_norm import add_rms_norm, rms_norm, rms_norm_reference

    x, w = _inputs((4099, 1000), torch.bfloat16, gen)
    r = torch.randn(x.shape, device="cuda", generator=gen).to(x.dtype)
    assert_close_rel(
        rms_norm(x, w, 1e-6, tile_elems), rms_norm_reference(x.float(), w.float(), 1e-6)
    )
    total, normed = add_rms_norm(x, r, w, 1e-6, tile_elems)
    ref_total = x.float() + r.float()
    assert_close_rel(total, ref_total)
    assert_close_rel(normed, rms_norm_reference(ref_total, w.float(), 1e-6))
