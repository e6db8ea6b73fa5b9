"""Gemma's RMSNorm form (``unit_offset``: fp32, scaled by ``1 + weight``, rounded once) in every
norm kernel: RMSNorm, add + RMSNorm, norm + add (+ the next norm), and the per-head q/k norm
fused with RoPE.

CPU: the references against transformers' ``Gemma3RMSNorm`` and Gemma 3's decoder-layer and
attention sequences, the custom ops' CPU and fake implementations (output dtypes), and the AOT
signatures against the launches. GPU: parity against fp32 references on fresh random inputs
(seed printed), odd shapes, NaN-poisoned outputs, every kernel variant the modules sweep.
"""

from __future__ import annotations

import cuda.tile as ct
import pytest
import torch
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm, apply_rotary_pos_emb
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from tilegym.ops import library
from tilegym.ops import rms_norm as rn
from tilegym.ops import rope as rp
from tilegym.ops.testing import assert_close_rel

EPS = 1e-6


def _gemma_norm(weight: torch.Tensor, dtype=torch.bfloat16) -> Gemma3RMSNorm:
    norm = Gemma3RMSNorm(weight.numel(), eps=EPS)
    norm.weight.data = weight.float()
    return norm.to(dtype)


# ------------------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_references_are_the_upstream_norms(dtype, cpu_gen):
    x = (torch.randn(5, 96, generator=cpu_gen) * 3).to(dtype)
    w = torch.randn(96, generator=cpu_gen).to(dtype)
    with torch.no_grad():
        gemma = _gemma_norm(w, dtype)(x)
        llama = LlamaRMSNorm(96, eps=EPS).to(dtype)
        llama.weight.data = w
        assert torch.equal(rn.rms_norm_reference(x, w, EPS, unit_offset=True), gemma)
        assert torch.equal(rn.rms_norm_reference(x, w, EPS), llama(x))
    assert not torch.allclose(gemma.float(), llama(x).float())  # the forms differ


def test_norm_add_reference_is_gemma3s_decoder_layer(cpu_gen):
    """``residual + post_norm(x)`` then ``pre_norm`` of the sum, as Gemma3DecoderLayer does."""
    dt = torch.bfloat16
    x, residual = (torch.randn(2, 7, 64, generator=cpu_gen).to(dt) for _ in range(2))
    w_post, w_pre = (torch.randn(64, generator=cpu_gen) for _ in range(2))
    post, pre = _gemma_norm(w_post), _gemma_norm(w_pre)
    with torch.no_grad():
        hidden = residual + post(x)
        want = (hidden, pre(hidden))
    got = rn.rms_norm_add_reference(x, residual, post.weight, EPS, pre.weight, unit_offset=True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    only = rn.rms_norm_add_reference(x, residual, post.weight, EPS, unit_offset=True)
    assert torch.equal(only[0], want[0]) and only[1] is None


def test_qk_norm_rope_reference_is_gemma3s_attention(cpu_gen):
    dt = torch.bfloat16
    b, s, d = 2, 5, 32
    q = torch.randn(b, s, 4, d, generator=cpu_gen).to(dt)
    k = torch.randn(b, s, 1, d, generator=cpu_gen).to(dt)
    cos, sin = (torch.randn(b, s, d, generator=cpu_gen).to(dt) for _ in range(2))
    qn, kn = (_gemma_norm(torch.randn(d, generator=cpu_gen)) for _ in range(2))
    with torch.no_grad():
        want = apply_rotary_pos_emb(qn(q.transpose(1, 2)), kn(k.transpose(1, 2)), cos, sin)
    got = rp.qk_norm_rope_reference(q, k, qn.weight, kn.weight, EPS, cos, sin, unit_offset=True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_cpu_ops_keep_the_input_dtype_and_fakes_agree(cpu_gen):
    """Gemma's norm returns x's dtype (``type_as``); Llama's promotes x and the weight."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(3, 64, generator=cpu_gen).to(torch.bfloat16)
    r = torch.randn(3, 64, generator=cpu_gen).to(torch.bfloat16)
    w, w2 = torch.randn(64, generator=cpu_gen), torch.randn(64, generator=cpu_gen)  # fp32 weights
    assert library.rms_norm(x, w, EPS, True).dtype == torch.bfloat16
    assert library.rms_norm(x, w, EPS).dtype == torch.float32
    assert torch.equal(library.rms_norm(x, w, EPS, True), rn.rms_norm_reference(x, w, EPS, True))
    total, normed = library.add_rms_norm(x, r, w, EPS, True)
    assert total.dtype == normed.dtype == torch.bfloat16
    total, normed = library.rms_norm_add_rms_norm(x, r, w, w2, EPS, True)
    assert torch.equal(total, library.rms_norm_add(x, r, w, EPS, True))
    assert torch.equal(normed, rn.rms_norm_reference(total, w2, EPS, True))
    q = torch.randn(1, 2, 4, 32, generator=cpu_gen).to(torch.bfloat16)
    cos = sin = torch.randn(1, 2, 32, generator=cpu_gen).to(torch.bfloat16)
    qo, ko = library.qk_norm_rope(q, q[:, :, :1], w[:32], w[:32], EPS, cos, sin, True)
    assert qo.shape == (1, 4, 2, 32) and ko.shape == (1, 1, 2, 32) and qo.dtype == torch.bfloat16
    with FakeTensorMode() as mode:
        fx, fr, fw, fw2 = (mode.from_tensor(t) for t in (x, r, w, w2))
        assert library.rms_norm_op(fx, fw, EPS, True).dtype == torch.bfloat16
        assert library.rms_norm_op(fx, fw, EPS, False).dtype == torch.float32
        assert [t.dtype for t in library.add_rms_norm_op(fx, fr, fw, EPS, True)] == [
            torch.bfloat16,
            torch.bfloat16,
        ]
        assert library.rms_norm_add_op(fx, fr, fw, EPS, True).shape == (3, 64)
        outs = library.rms_norm_add_rms_norm_op(fx, fr, fw, fw2, EPS, True)
        assert [t.shape for t in outs] == [(3, 64), (3, 64)]
        fq, fc = mode.from_tensor(q), mode.from_tensor(cos)
        qo, ko = library.qk_norm_rope_op(fq, fq[:, :, :1], fw[:32], fw[:32], EPS, fc, fc, True)
        assert qo.dtype == torch.bfloat16 and ko.shape == (1, 1, 2, 32)


def test_rms_norm_add_refuses_a_norm_in_another_dtype():
    """The norm of x is added to the residual in x's dtype: a promoting (Llama) norm with an
    fp32 weight would round differently, so it is refused before anything is launched."""
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    w = torch.ones(8)
    with pytest.raises(ValueError, match="by a torch.float32 weight is not in x's dtype"):
        rn.rms_norm_add(x, x, w, EPS)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):  # Gemma's form: x's dtype
        rn.rms_norm_add(x, x, w, EPS, unit_offset=True)


def _matches(params, args) -> bool:
    """Whether a launch's arguments fit a signature: arrays of its ranks, scalars where it has
    run-time scalars, and its compile-time constants."""
    from cuda.tile.compilation import ArrayConstraint, ScalarConstraint

    if len(params) != len(args):
        return False
    for p, a in zip(params, args, strict=True):
        if isinstance(p, ArrayConstraint):
            ok = isinstance(a, torch.Tensor) and a.dim() == p.ndim
        elif isinstance(p, ScalarConstraint):
            ok = isinstance(a, int | float) and not isinstance(a, bool)
        else:
            ok = getattr(p, "value", p) == a and type(getattr(p, "value", p)) is type(a)
        if not ok:
            return False
    return True


def _uncovered(launches, sigs) -> list:
    """The launches no declared signature of their kernel fits."""
    return [
        (k, args)
        for k, args in launches
        if not any(_matches(s.parameters, args) for s in sigs.get(k, ()))
    ]


@pytest.fixture
def launches(monkeypatch):
    """Record (kernel, args) of every ct.launch instead of launching (CPU tensors)."""
    seen = []
    monkeypatch.setattr(
        ct, "launch", lambda stream, grid, kernel, args, **kw: seen.append((kernel, args))
    )
    for module in (rn, rp):
        monkeypatch.setattr(module, "stream", lambda *a: None)
        monkeypatch.setattr(module, "check_activation", lambda *a: None)
    return seen


def test_norm_aot_signatures_cover_the_gemma3_launches(launches):
    x = torch.zeros(5, 1152, dtype=torch.bfloat16)
    w = torch.zeros(1152, dtype=torch.bfloat16)
    rn.rms_norm(x, w, EPS, unit_offset=True)
    rn.add_rms_norm(x, x.clone(), w, EPS, unit_offset=True)
    rn.rms_norm_add(x, x.clone(), w, EPS, unit_offset=True)
    rn.rms_norm_add(x, x.clone(), w, EPS, w, unit_offset=True)
    sigs = rn.aot_signatures(
        hidden_sizes=(1152,),
        dtypes=(torch.bfloat16,),
        unit_offsets=(True,),
        ops=("plain", "fused", "norm_add"),
    )
    assert len(launches) == 4 and not _uncovered(launches, sigs)
    assert all(args[-1] is True for _, args in launches)  # Gemma's form, the last constant


def test_qk_aot_signatures_cover_the_gemma3_launches(launches):
    hq, hk, d = 4, 1, 256
    for b, s in ((1, 1), (8, 1), (1, 33), (2, 37), (1, 2048)):
        qkv = torch.zeros(b, s, (hq + 2 * hk) * d, dtype=torch.bfloat16)
        q = qkv[..., : hq * d].view(b, s, hq, d)
        k = qkv[..., hq * d : (hq + hk) * d].view(b, s, hk, d)
        cos = torch.zeros(1, s, d, dtype=torch.bfloat16)
        w = torch.zeros(d, dtype=torch.bfloat16)
        rp.qk_norm_rope(q, k, w, w, EPS, cos, cos, unit_offset=True)
    sigs = rp.aot_signatures(
        heads=((hq, hk, d),),
        dtypes=(torch.bfloat16,),
        partial_rot=(),
        ops=("qk",),
        unit_offsets=(True,),
    )
    assert {k for k, _ in launches} == {rp.qk_norm_rope_kernel, rp.qk_norm_rope_loop_kernel}
    assert not _uncovered(launches, sigs)
    assert all(args[-1] is True for _, args in launches)


# ------------------------------------------------------------------------------------- GPU

SHAPES = [(1, 1152), (3, 1000), (7, 3, 1024), (33, 4097), (130, 256), (2, 8192)]
DTYPES = [torch.bfloat16, torch.float16]


def _inputs(shape, dtype, gen):
    x = torch.randn(shape, device="cuda", generator=gen).to(dtype) * 3
    w = (0.5 * torch.randn(shape[-1], device="cuda", generator=gen)).to(dtype)  # offsets from 1
    return x, w


def _ref(x, w):
    return rn.rms_norm_reference(x.float(), w.float(), EPS, unit_offset=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_unit_offset(shape, dtype, gen, poison_empty):
    x, w = _inputs(shape, dtype, gen)
    out = rn.rms_norm(x, w, EPS, unit_offset=True)
    assert out.shape == x.shape and out.dtype == dtype
    assert_close_rel(out, _ref(x, w))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(rn.VARIANTS))
def test_rms_norm_unit_offset_variants(name, gen, poison_empty):
    kw = rn.VARIANTS[name]
    x, w = _inputs((1029, 1152), torch.bfloat16, gen)
    r = torch.randn(x.shape, device="cuda", generator=gen).to(torch.bfloat16)
    assert_close_rel(rn.rms_norm(x, w, EPS, unit_offset=True, **kw), _ref(x, w))
    total, normed = rn.add_rms_norm(x, r, w, EPS, unit_offset=True, **kw)
    ref_total = x.float() + r.float()
    assert_close_rel(total, ref_total)
    assert_close_rel(normed, _ref(ref_total, w))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_add_with_and_without_the_next_norm(shape, dtype, gen, poison_empty):
    x, w = _inputs(shape, dtype, gen)
    _, w_next = _inputs(shape, dtype, gen)
    r = torch.randn(shape, device="cuda", generator=gen).to(dtype) * 2
    ref_total = r.float() + _ref(x, w)
    total, normed = rn.rms_norm_add(x, r, w, EPS, w_next, unit_offset=True)
    assert total.dtype == normed.dtype == dtype
    assert_close_rel(total, ref_total)
    assert_close_rel(normed, _ref(ref_total, w_next))
    total, none = rn.rms_norm_add(x, r, w, EPS, unit_offset=True)
    assert none is None
    assert_close_rel(total, ref_total)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(37, 2048), (1, 4096), (8, 4096), (2048, 4096)])
def test_rms_norm_add_llama_form(shape, gen, poison_empty):
    """Without the offset the kernel is a Llama-form post-norm (weight * x / rms(x)): OLMo 2/3's
    post-norm steps at their decode and prompt shapes, with and without a next norm."""
    x, w = _inputs(shape, torch.bfloat16, gen)
    r = torch.randn(x.shape, device="cuda", generator=gen).to(torch.bfloat16)
    ref_total = r.float() + rn.rms_norm_reference(x.float(), w.float(), EPS)
    total, normed = rn.rms_norm_add(x, r, w, EPS, w)
    assert_close_rel(total, ref_total)
    assert_close_rel(normed, rn.rms_norm_reference(ref_total, w.float(), EPS))
    alone, none = rn.rms_norm_add(x, r, w, EPS)
    assert none is None
    assert_close_rel(alone, ref_total)


@pytest.mark.gpu
def test_the_wrong_form_fails_the_check(gen):
    x, w = _inputs((16, 1152), torch.bfloat16, gen)
    with pytest.raises(AssertionError, match="relative error"):
        assert_close_rel(rn.rms_norm(x, w, EPS), _ref(x, w))


# (batch, seq, q heads, kv heads, head dim, cos batched)
QK_CASES = [
    (1, 1, 4, 1, 256, False),  # gemma-3-1b decode
    (8, 1, 4, 1, 256, False),  # decode, batch 8
    (2, 37, 4, 1, 256, True),  # 74 tokens: the head-loop kernel
    (1, 131, 8, 4, 256, False),  # gemma-3-4b heads, several token tiles
    (3, 5, 6, 3, 80, False),  # half = 40: view path, padded heads
    (2, 19, 16, 8, 128, True),  # gemma-3-27b heads
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", QK_CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("name", list(rp.QK_VARIANTS))
def test_qk_norm_rope_unit_offset(name, case, gen, poison_empty):
    b, s, hq, hk, d, batched = case
    dt = torch.bfloat16
    qkv = torch.randn(b, s, (hq + 2 * hk) * d, device="cuda", generator=gen).to(dt) * 4
    q = qkv[..., : hq * d].view(b, s, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].view(b, s, hk, d)
    qw = (0.3 * torch.randn(d, device="cuda", generator=gen)).to(dt)
    kw = (0.3 * torch.randn(d, device="cuda", generator=gen)).to(dt)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    pos = torch.randint(0, 4096, (b if batched else 1, s), device="cuda", generator=gen).float()
    emb = torch.cat([pos[..., None] * inv] * 2, dim=-1)
    cos, sin = emb.cos(), emb.sin()
    kwargs = rp.QK_VARIANTS[name]
    q_out, k_out = rp.qk_norm_rope(
        q, k, qw, kw, EPS, cos.to(dt), sin.to(dt), unit_offset=True, **kwargs
    )
    q_ref, k_ref = rp.qk_norm_rope_reference(
        q.float(), k.float(), qw.float(), kw.float(), EPS, cos, sin, unit_offset=True
    )
    assert q_out.shape == (b, hq, s, d) and k_out.shape == (b, hk, s, d)
    assert q_out.dtype == k_out.dtype == dt
    assert_close_rel(q_out, q_ref)
    assert_close_rel(k_out, k_ref)
