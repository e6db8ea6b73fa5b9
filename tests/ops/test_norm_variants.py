"""Every kernel variant that benchmarks/ops/gpu_check_norms2.sh sweeps matches the fp32
reference (odd shapes, NaN-poisoned outputs), so the lead can flip a default from the table."""

import pytest
import torch
from test_rope import _cos_sin

from tilegym.ops import rms_norm as rn
from tilegym.ops import rope as rp
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


# (batch, q heads, kv heads, seq, head dim, rotary dim, cos batched)
ROPE_CASES = [
    (2, 16, 8, 37, 128, 128, True),
    (1, 32, 8, 1, 64, 64, False),
    (2, 4, 2, 9, 64, 32, False),
    (2, 5, 3, 7, 80, 80, True),
]


@pytest.mark.parametrize("case", ROPE_CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("name", list(rp.ROPE_VARIANTS))
def test_rope_variants(name, case, gen, poison_empty):
    b, hq, hk, s, d, rot, batched = case
    dt = torch.bfloat16
    q = torch.randn(b, s, hq, d, device="cuda", generator=gen).to(dt).transpose(1, 2)
    k = torch.randn(b, s, hk, d, device="cuda", generator=gen).to(dt).transpose(1, 2)
    cos, sin = _cos_sin(b if batched else 1, s, rot, gen)
    q_out, k_out = rp.apply_rope(q, k, cos.to(dt), sin.to(dt), **rp.ROPE_VARIANTS[name])
    q_ref, k_ref = rp.apply_rope_reference(q.float(), k.float(), cos, sin)
    assert_close_rel(q_out, q_ref)
    assert_close_rel(k_out, k_ref)


# (batch, seq, q heads, kv heads, head dim, cos batched)
QK_CASES = [(2, 37, 16, 8, 128, True), (8, 1, 16, 8, 128, False), (3, 5, 6, 3, 80, False)]


@pytest.mark.parametrize("case", QK_CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("name", list(rp.QK_VARIANTS))
def test_qk_norm_rope_variants(name, case, gen, poison_empty):
    b, s, hq, hk, d, batched = case
    dt = torch.bfloat16
    qkv = torch.randn(b, s, (hq + 2 * hk) * d, device="cuda", generator=gen).to(dt) * 4
    q = qkv[..., : hq * d].view(b, s, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].view(b, s, hk, d)
    qw = (1 + 0.3 * torch.randn(d, device="cuda", generator=gen)).to(dt)
    kw = (1 + 0.3 * torch.randn(d, device="cuda", generator=gen)).to(dt)
    cos, sin = _cos_sin(b if batched else 1, s, d, gen)
    kwargs = rp.QK_VARIANTS[name]
    q_out, k_out = rp.qk_norm_rope(q, k, qw, kw, 1e-6, cos.to(dt), sin.to(dt), **kwargs)
    q_ref, k_ref = rp.qk_norm_rope_reference(
        q.float(), k.float(), qw.float(), kw.float(), 1e-6, cos, sin
    )
    assert q_out.shape == (b, hq, s, d) and k_out.shape == (b, hk, s, d)
    assert_close_rel(q_out, q_ref)
    assert_close_rel(k_out, k_ref)
