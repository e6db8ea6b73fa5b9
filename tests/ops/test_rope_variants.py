"""Every RoPE / q-k-norm+RoPE variant that benchmarks/ops/bench_rope.py sweeps matches the fp32
reference: odd token counts (partial token tiles), batched and shared cos/sin, partial rotary,
head dims whose half is not a power of two (the (..., 2, R/2)-view path), decode and prefill
sizes on both sides of the "auto" threshold, outputs NaN-poisoned before the call."""

import os

import pytest
import torch
from test_rope import _cos_sin

from tilegym.ops import rope as rp
from tilegym.ops.testing import assert_close_rel

pytestmark = pytest.mark.gpu


def _shard(names):
    """``ROPE_VARIANT_SHARD=I/N``: only every N-th variant from the I-th (parallel GPU shards
    compile disjoint kernels; see benchmarks/ops/gpu_check_rope.sh)."""
    spec = os.environ.get("ROPE_VARIANT_SHARD")
    if not spec:
        return list(names)
    i, n = (int(v) for v in spec.split("/"))
    return list(names)[i::n]


#: The tests that are not per variant run in shard 0 only.
other_shard = pytest.mark.skipif(
    os.environ.get("ROPE_VARIANT_SHARD", "0/1").split("/")[0] != "0",
    reason="runs in ROPE_VARIANT_SHARD 0",
)


# (batch, q heads, kv heads, seq, head dim, rotary dim, cos batched)
ROPE_CASES = [
    (2, 16, 8, 37, 128, 128, True),  # qwen3 heads, odd seq, 74 tokens (> auto threshold)
    (1, 32, 8, 67, 64, 64, False),  # llama heads, odd seq
    (8, 16, 8, 1, 128, 128, False),  # decode, batch 8
    (1, 32, 8, 1, 64, 64, False),  # decode, batch 1
    (3, 32, 8, 5, 64, 64, True),  # 15 tokens
    (2, 4, 2, 9, 64, 32, False),  # partial rotary (pass-through copy)
    (2, 5, 3, 7, 80, 80, True),  # half = 40: (..., 2, R/2) views, padded heads and halves
    (1, 3, 1, 45, 96, 48, True),  # partial + non power-of-two half
    (1, 12, 3, 19, 64, 64, False),  # head counts no head block divides (masked head tiles)
]


def _rope_inputs(case, gen, dt=torch.bfloat16):
    b, hq, hk, s, d, rot, batched = case
    # as the patch hands them over: transposed views of slices of one fused QKV output
    qkv = torch.randn(b, s, (hq + 2 * hk) * d, device="cuda", generator=gen).to(dt)
    q = qkv[..., : hq * d].view(b, s, hq, d).transpose(1, 2)
    k = qkv[..., hq * d : (hq + hk) * d].view(b, s, hk, d).transpose(1, 2)
    cos, sin = _cos_sin(b if batched else 1, s, rot, gen)
    return q, k, cos, sin


@pytest.mark.parametrize("case", ROPE_CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("name", _shard(rp.ROPE_VARIANTS))
def test_rope_variants(name, case, gen, poison_empty):
    dt = torch.bfloat16
    q, k, cos, sin = _rope_inputs(case, gen, dt)
    q_out, k_out = rp.apply_rope(q, k, cos.to(dt), sin.to(dt), **rp.ROPE_VARIANTS[name])
    q_ref, k_ref = rp.apply_rope_reference(q.float(), k.float(), cos, sin)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    assert q_out.is_contiguous() and k_out.is_contiguous()
    assert_close_rel(q_out, q_ref)
    assert_close_rel(k_out, k_ref)


@other_shard
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("variant", ["token", "loop"])
def test_rope_dtypes(variant, dtype, gen, poison_empty):
    q, k, cos, sin = _rope_inputs((2, 16, 8, 37, 128, 128, True), gen, dtype)
    q_out, k_out = rp.apply_rope(q, k, cos.to(dtype), sin.to(dtype), variant=variant)
    q_ref, k_ref = rp.apply_rope_reference(q.float(), k.float(), cos, sin)
    assert q_out.dtype == dtype
    assert_close_rel(q_out, q_ref)
    assert_close_rel(k_out, k_ref)


# (batch, seq, q heads, kv heads, head dim, cos batched)
QK_CASES = [
    (2, 37, 16, 8, 128, True),  # 74 tokens, odd seq
    (1, 131, 16, 8, 128, False),  # odd seq, several token tiles
    (8, 1, 16, 8, 128, False),  # decode, batch 8
    (1, 1, 16, 8, 128, False),  # decode, batch 1
    (3, 5, 6, 3, 80, False),  # half = 40: view path, padded heads
    (4, 3, 32, 8, 64, True),  # llama-like heads
    (2, 19, 12, 3, 128, True),  # head counts no head block divides (masked head tiles)
]


@pytest.mark.parametrize("case", QK_CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("name", _shard(rp.QK_VARIANTS))
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


@other_shard
def test_auto_threshold_picks_both_kernels(gen, monkeypatch):
    """Variant "auto" launches the per-token kernels up to ``*_TOKEN_MAX`` tokens, the head-loop
    kernels above."""
    import cuda.tile as ct

    seen = []
    real = ct.launch

    def spy(stream, grid, kernel, args):
        seen.append(kernel)
        return real(stream, grid, kernel, args)

    monkeypatch.setattr(ct, "launch", spy)
    assert rp.ROPE_TOKEN_MAX == rp.QK_TOKEN_MAX
    for tokens in (rp.ROPE_TOKEN_MAX, rp.ROPE_TOKEN_MAX + 1):
        q, k, cos, sin = _rope_inputs((1, 32, 8, tokens, 64, 64, False), gen)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        rp.apply_rope(q, k, cos, sin, variant="auto")
        w = q[0, 0, 0]
        qs, ks = q.transpose(1, 2), k.transpose(1, 2)
        rp.qk_norm_rope(qs, ks, w, w, 1e-6, cos, sin, variant="auto")
    assert seen[0] is rp.rope_kernel and seen[1] is rp.qk_norm_rope_kernel
    assert seen[2] is rp.rope_loop_kernel and seen[3] is rp.qk_norm_rope_loop_kernel


@other_shard
def test_decode_heads_spread_a_decode_step_over_one_block_a_head(gen, monkeypatch):
    """With ``decode_heads`` 1 a decode call launches the head-loop kernels, one block per q
    head and per k head (the per-token kernel: one block for all of them)."""
    import cuda.tile as ct

    seen = []
    real = ct.launch

    def spy(stream, grid, kernel, args):
        seen.append((kernel, tuple(grid)))
        return real(stream, grid, kernel, args)

    monkeypatch.setattr(ct, "launch", spy)
    q, k, cos, sin = _rope_inputs((1, 16, 8, 1, 128, 128, False), gen)
    cos, sin = cos.to(q.dtype), sin.to(q.dtype)
    rp.apply_rope(q, k, cos, sin, decode_heads=1)
    w = q[0, 0, 0]
    rp.qk_norm_rope(q.transpose(1, 2), k.transpose(1, 2), w, w, 1e-6, cos, sin, decode_heads=1)
    assert seen == [(rp.rope_loop_kernel, (24, 1, 1)), (rp.qk_norm_rope_loop_kernel, (24, 1, 1))]
