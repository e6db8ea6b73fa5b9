"""GPU parity of RoPE (q and k in one launch) and Qwen3's fused q/k-norm + RoPE."""

import pytest
import torch

from tilegym.ops.testing import assert_close_rel

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16]

# (batch, q heads, kv heads, seq, head dim, rotary dim, cos batched)
ROPE_CASES = [
    (1, 16, 8, 1, 128, 128, False),
    (2, 16, 8, 37, 128, 128, True),
    (3, 32, 8, 5, 64, 64, False),
    (2, 5, 3, 7, 80, 80, True),
    (2, 4, 2, 9, 64, 32, False),
    (1, 3, 1, 3, 96, 48, True),
]


def _cos_sin(bc, seq, rot, gen):
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, device="cuda").float() / rot))
    pos = torch.randint(0, 4096, (bc, seq), device="cuda", generator=gen).float()
    emb = torch.cat([pos[..., None] * inv] * 2, dim=-1)
    return emb.cos(), emb.sin()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ROPE_CASES)
def test_apply_rope(case, dtype, gen, poison_empty):
    from tilegym.ops.rope import apply_rope, apply_rope_reference

    b, hq, hk, s, d, rot, batched = case
    # HF hands q/k over as transposed views of (B, S, H, D) projections
    q = torch.randn(b, s, hq, d, device="cuda", generator=gen).to(dtype).transpose(1, 2)
    k = torch.randn(b, s, hk, d, device="cuda", generator=gen).to(dtype).transpose(1, 2)
    cos, sin = _cos_sin(b if batched else 1, s, rot, gen)
    q_out, k_out = apply_rope(q, k, cos.to(dtype), sin.to(dtype))
    q_ref, k_ref = apply_rope_reference(q.float(), k.float(), cos, sin)
    assert_close_rel(q_out, q_ref)
    assert_close_rel(k_out, k_ref)


# (batch, seq, q heads, kv heads, head dim)
QK_CASES = [(1, 1, 16, 8, 128), (2, 37, 16, 8, 128), (3, 5, 6, 3, 80), (4, 3, 32, 8, 64)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", QK_CASES)
def test_qk_norm_rope(case, dtype, gen, poison_empty):
    from tilegym.ops.rope import qk_norm_rope, qk_norm_rope_reference

    b, s, hq, hk, d = case
    # q and k as slices of one fused QKV projection output, like the linear patch produces
    qkv = torch.randn(b, s, (hq + 2 * hk) * d, device="cuda", generator=gen).to(dtype) * 4
    q = qkv[..., : hq * d].view(b, s, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].view(b, s, hk, d)
    qw = (1 + 0.3 * torch.randn(d, device="cuda", generator=gen)).to(dtype)
    kw = (1 + 0.3 * torch.randn(d, device="cuda", generator=gen)).to(dtype)
    cos, sin = _cos_sin(1, s, d, gen)
    q_out, k_out = qk_norm_rope(q, k, qw, kw, 1e-6, cos.to(dtype), sin.to(dtype))
    q_ref, k_ref = qk_norm_rope_reference(
        q.float(), k.float(), qw.float(), kw.float(), 1e-6, cos, sin
    )
    assert q_out.shape == (b, hq, s, d) and k_out.shape == (b, hk, s, d)
    assert_close_rel(q_out, q_ref)
    assert_close_rel(k_out, k_ref)


def test_zero_output_fails_against_real_reference(gen):
    from tilegym.ops.rope import apply_rope_reference

    q = torch.randn(1, 4, 5, 64, device="cuda", generator=gen)
    cos, sin = _cos_sin(1, 5, 64, gen)
    q_ref, _ = apply_rope_reference(q, q, cos, sin)
    with pytest.raises(AssertionError):
        assert_close_rel(torch.zeros_like(q_ref).to(torch.bfloat16), q_ref)
