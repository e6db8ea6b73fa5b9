"""Every RMSNorm kernel variant that benchmarks/ops/gpu_check_norms.sh sweeps matches the fp32
reference (odd shapes, NaN-poisoned outputs), so the lead can flip a default from the table.
The RoPE variants are checked in test_rope_variants.py."""

import pytest
import torch

from tilegym.ops import rms_norm as rn
from tilegym.ops.testing import assert_close_rel

pytestmark = pytest.mark.gpu

RMS_SHAPES = [(37, 1000), (1029, 4096), (300, 2048)]


@pytest.mark.parametrize("shape", RMS_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", list(rn.VARIANTS))
def test_rms_variants(name, shape, gen, poison_empty):
    kw = rn.VARIANTS[name]
    x = torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16) * 3
    w = (1 + 0.5 * torch.randn(shape[-1], device="cuda", generator=gen)).to(torch.bfloat16)
    r = torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)
    assert_close_rel(
        rn.rms_norm(x, w, 1e-6, **kw), rn.rms_norm_reference(x.float(), w.float(), 1e-6)
    )
    total, normed = rn.add_rms_norm(x, r, w, 1e-6, **kw)
    ref_total = x.float() + r.float()
    assert_close_rel(total, ref_total)
    assert_close_rel(normed, rn.rms_norm_reference(ref_total, w.float(), 1e-6))
