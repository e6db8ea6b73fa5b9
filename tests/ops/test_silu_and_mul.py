"""GPU parity of SiLU-and-mul over separate and concatenated gate/up."""

import pytest
import torch

from tilegym.ops.testing import assert_close_rel

pytestmark = pytest.mark.gpu

SHAPES = [(1, 3072), (7, 3000), (3, 5, 1000), (2048, 8192), (17, 100)]
DTYPES = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("concatenated", [False, True])
def test_silu_and_mul(shape, dtype, concatenated, gen, poison_empty):
    from tilegym.ops.silu_and_mul import silu_and_mul, silu_and_mul_reference

    gate = torch.randn(shape, device="cuda", generator=gen).to(dtype) * 3
    up = torch.randn(shape, device="cuda", generator=gen).to(dtype)
    out = silu_and_mul(torch.cat([gate, up], dim=-1)) if concatenated else silu_and_mul(gate, up)
    assert out.shape == shape
    assert_close_rel(out, silu_and_mul_reference(gate.float(), up.float()))


def test_zero_output_fails_against_real_reference(gen):
    from tilegym.ops.silu_and_mul import silu_and_mul_reference

    g = torch.randn(8, 64, device="cuda", generator=gen)
    ref = silu_and_mul_reference(g, g)
    with pytest.raises(AssertionError):
        assert_close_rel(torch.zeros_like(ref).half(), ref)
