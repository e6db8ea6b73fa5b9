"""``gemm.rms_norm_linear_rope``: a layer's input RMSNorm, packed QKV projection and RoPE in one
GEMV launch (``tilegym_norm_rope_gemv_kernel``).

GPU tests: against an fp64 norm, GEMM and rotation on fresh random inputs and real RoPE angles
(head widths 64 and 128, GQA head counts, some heads unrotated, bias, Gemma's ``1 + weight``,
one and three rows, bf16 and fp16, outputs poisoned); against transformers' rounded three-step
form; the programmatic-dependent launch's wait; bad shapes as one ``ValueError``. CPU tests: the
AOT signatures compile for sm_90, and the op's CPU reference is transformers' own RoPE.
"""

from __future__ import annotations

import io
import math

import pytest
import torch
from test_gemm import GEMM_TOL
from test_rms_norm_linear import EPS, _check_with_x_written_late, _inputs, _rand, _reference

from tilegym.ops.gemm_configs import TileConfig
from tilegym.ops.testing import assert_close_rel

#: (rows, q heads, kv heads, head dim, hidden): llama-3.2-1B's and Qwen2.5-7B's decode, odd K
#: and head counts, a few rows
CASES = [
    (1, 32, 8, 64, 2048),
    (1, 28, 4, 128, 3584),
    (1, 3, 1, 64, 1000),
    (3, 5, 5, 128, 3000),
]
CONFIGS = [None, TileConfig(1, 4, 512, gemv=True), TileConfig(1, 8, 256, gemv=True)]


def _angles(m: int, d: int, gen, dtype):
    """cos/sin ``[m, d]`` of positions up to 8K at rope_theta 500000, both halves equal."""
    pos = torch.randint(0, 8192, (m, 1), device="cuda", generator=gen).double()
    inv = 500000.0 ** (-torch.arange(0, d, 2, device="cuda").double() / d)
    freqs = torch.cat((pos * inv, pos * inv), dim=-1)
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


def _rope_reference(qkv, cos, sin, rotated: int, norms=None):
    """fp64 ``x * cos + rotate_half(x) * sin`` on the first ``rotated`` heads; ``norms``
    ``(q weight, k weight, q heads, unit_offset)``: each of them RMS-normed first."""
    d = cos.shape[-1]
    heads = qkv.view(qkv.shape[0], -1, d).clone()
    c, s = cos.double()[:, None, :], sin.double()[:, None, :]
    rot = heads[:, :rotated]
    if norms is not None:
        qw, kw, nq, offset = norms
        w = torch.cat((qw.double().expand(nq, d), kw.double().expand(rotated - nq, d)))
        w = 1.0 + w if offset else w
        rot = rot * torch.rsqrt(rot.pow(2).mean(-1, keepdim=True) + EPS) * w
    halves = torch.cat((-rot[..., d // 2 :], rot[..., : d // 2]), dim=-1)
    heads[:, :rotated] = rot * c + halves * s
    return heads.view(qkv.shape)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "cfg", CONFIGS, ids=lambda c: "own" if c is None else f"{c.tm}x{c.tn}x{c.tk}"
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("unit_offset", [False, True])
def test_norm_rope_gemv_matches_fp64(cfg, dtype, unit_offset, gen):
    from tilegym.ops import gemm

    for m, hq, hk, d, k in CASES:
        n = (hq + 2 * hk) * d
        for bias in (False, True):
            for rotated in (hq + hk, hq):
                x, nw, w, b = _inputs(m, n, k, gen, dtype, bias)
                cos, sin = _angles(m, d, gen, dtype)
                out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
                res = gemm.rms_norm_linear_rope(
                    x,
                    nw,
                    EPS,
                    w,
                    b,
                    cos,
                    sin,
                    rotated,
                    unit_offset=unit_offset,
                    out=out,
                    config=cfg,
                )
                assert res.data_ptr() == out.data_ptr()
                want = _rope_reference(_reference(x, nw, w, b, unit_offset), cos, sin, rotated)
                assert_close_rel(out, want, tol=GEMM_TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("unit_offset", [False, True])
def test_head_norms_match_fp64(dtype, unit_offset, gen):
    """With per-head q/k norms (Qwen3's; Gemma's ``1 + weight``): the last block of each head
    norms and rotates it. Called three times on fresh inputs (the counters must be back at
    zero), outputs poisoned."""
    from tilegym.ops import gemm

    for m, hq, hk, d, k in [(1, 16, 8, 128, 1024), (1, 4, 1, 256, 1152), (2, 5, 5, 64, 1000)]:
        n = (hq + 2 * hk) * d
        for _ in range(3):
            x, nw, w, b = _inputs(m, n, k, gen, dtype, m == 2)
            qw, kw = (_rand((d,), gen, dtype, 0.3, 1.0) for _ in range(2))
            heads = gemm.HeadNorms(qw, kw, EPS, hq, unit_offset)
            cos, sin = _angles(m, d, gen, dtype)
            out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
            gemm.rms_norm_linear_rope(
                x, nw, EPS, w, b, cos, sin, hq + hk, head_norms=heads, out=out
            )
            norms = (qw, kw, hq, unit_offset)
            ref = _rope_reference(_reference(x, nw, w, b, False), cos, sin, hq + hk, norms)
            assert_close_rel(out, ref, tol=GEMM_TOL[dtype])


@pytest.mark.gpu
def test_head_norms_against_qwen3s_four_steps(gen):
    """Against RMSNorm, the GEMM, Qwen3's per-head q_norm / k_norm (each rounded) and
    transformers' RoPE in bf16, at Qwen3-0.6B's decode shape."""
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    from tilegym.ops import gemm
    from tilegym.ops.rms_norm import rms_norm, rms_norm_reference

    hq, hk, d, k = 16, 8, 128, 1024
    x, nw, w, _ = _inputs(1, (hq + 2 * hk) * d, k, gen, torch.bfloat16, False)
    qw, kw = (_rand((d,), gen, torch.bfloat16, 0.3, 1.0) for _ in range(2))
    cos, sin = _angles(1, d, gen, torch.bfloat16)
    heads = gemm.HeadNorms(qw, kw, EPS, hq)
    fused = gemm.rms_norm_linear_rope(x, nw, EPS, w, None, cos, sin, hq + hk, head_norms=heads)
    qkv = gemm.linear(rms_norm(x, nw, EPS), w)
    q = rms_norm_reference(qkv[:, : hq * d].view(1, 1, hq, d), qw, EPS, False).transpose(1, 2)
    kk = rms_norm_reference(qkv[:, hq * d : (hq + hk) * d].view(1, 1, hk, d), kw, EPS, False)
    q, kk = apply_rotary_pos_emb(q, kk.transpose(1, 2), cos[None], sin[None])
    four = torch.cat(
        (q.transpose(1, 2).reshape(1, -1), kk.transpose(1, 2).reshape(1, -1), qkv[:, -hk * d :]),
        dim=-1,
    )
    assert_close_rel(fused, four.float(), tol=3 * GEMM_TOL[torch.bfloat16])


@pytest.mark.gpu
def test_norm_rope_gemv_against_the_three_launches(gen):
    """Against RMSNorm then the GEMM (each rounded) then transformers' RoPE in bf16: within
    about two bf16 roundings of the projection."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from tilegym.ops import gemm
    from tilegym.ops.rms_norm import rms_norm

    m, hq, hk, d, k = CASES[0]
    x, nw, w, _ = _inputs(m, (hq + 2 * hk) * d, k, gen, torch.bfloat16, False)
    cos, sin = _angles(m, d, gen, torch.bfloat16)
    fused = gemm.rms_norm_linear_rope(x, nw, EPS, w, None, cos, sin, hq + hk)
    qkv = gemm.linear(rms_norm(x, nw, EPS), w)
    q = qkv[:, : hq * d].view(1, m, hq, d).transpose(1, 2)
    kk = qkv[:, hq * d : (hq + hk) * d].view(1, m, hk, d).transpose(1, 2)
    q, kk = apply_rotary_pos_emb(q, kk, cos[None], sin[None])
    three = torch.cat(
        (q.transpose(1, 2).reshape(m, -1), kk.transpose(1, 2).reshape(m, -1), qkv[:, -hk * d :]),
        dim=-1,
    )
    assert_close_rel(fused, three.float(), tol=2 * GEMM_TOL[torch.bfloat16])


@pytest.mark.gpu
def test_norm_rope_gemv_pdl_waits_for_the_kernel_writing_x(gen, monkeypatch):
    """Both halves' first W tiles before the wait, X (written late) after it; the first call
    reads the weight without PDL, the next ones with it."""
    from tilegym.ops import gemm

    monkeypatch.setattr(gemm, "GEMV_PDL", True)
    m, hq, hk, d, k = 1, 8, 2, 128, 3072
    src, nw, w, b = _inputs(m, (hq + 2 * hk) * d, k, gen, torch.bfloat16, True)
    cos, sin = _angles(m, d, gen, torch.bfloat16)
    ref = _rope_reference(_reference(src, nw, w, b, False), cos, sin, hq + hk)
    _check_with_x_written_late(
        src,
        ref,
        lambda x, out: gemm.rms_norm_linear_rope(x, nw, EPS, w, b, cos, sin, hq + hk, out=out),
    )


@pytest.mark.gpu
def test_bad_shapes_are_one_clear_error(gen):
    from tilegym.ops import gemm

    x, nw, w, _ = _inputs(1, 12 * 64, 256, gen, torch.bfloat16, False)
    cos, sin = _angles(1, 64, gen, torch.bfloat16)
    with pytest.raises(ValueError, match="rotated heads 13 of 12"):
        gemm.rms_norm_linear_rope(x, nw, EPS, w, None, cos, sin, 13)
    with pytest.raises(ValueError, match="heads of 80"):
        wide_cos, wide_sin = _angles(1, 80, gen, torch.bfloat16)
        gemm.rms_norm_linear_rope(x, nw, EPS, w, None, wide_cos, wide_sin, 4)
    with pytest.raises(ValueError, match="one row a block"):
        two_rows = TileConfig(2, 8, 256, gemv=True)
        gemm.rms_norm_linear_rope(x, nw, EPS, w, None, cos, sin, 4, config=two_rows)
    with pytest.raises(ValueError, match=r"one \[64\] row per row of x \(1\)"):
        two_cos, two_sin = _angles(2, 64, gen, torch.bfloat16)
        gemm.rms_norm_linear_rope(x, nw, EPS, w, None, two_cos, two_sin, 4)


@pytest.mark.slow
@pytest.mark.parametrize("head_dim,head_norm", [(64, False), (128, False), (128, True)])
def test_norm_rope_signatures_compile(head_dim, head_norm):
    """The AOT signatures (bias x PDL) compile for sm_90, with and without per-head norms."""
    from cuda.tile.compilation import export_kernel

    from tilegym.ops import gemm

    sigs = gemm.norm_rope_signatures(head_dim, head_norm=head_norm)
    (kernel,) = sigs
    assert len(sigs[kernel]) == 4
    buf = io.BytesIO()
    export_kernel(kernel, sigs[kernel], buf, gpu_code="sm_90", output_format="cubin")
    assert len(buf.getvalue()) > 1000


def test_the_cpu_reference_is_transformers_rope_on_the_projection():
    """On a CPU the op runs norm, projection and transformers' ``apply_rotary_pos_emb`` on the
    first heads, rounding where transformers does; the value heads stay as projected."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from tilegym.ops import library
    from tilegym.ops.rms_norm import rms_norm_reference

    gen = torch.Generator().manual_seed(0)
    hq, hk, d, k = 4, 2, 16, 48
    dt = torch.bfloat16
    x = torch.randn(1, 1, k, generator=gen).to(dt)
    nw = (1 + 0.1 * torch.randn(k, generator=gen)).to(dt)
    w = (torch.randn((hq + 2 * hk) * d, k, generator=gen) / math.sqrt(k)).to(dt)
    ang = torch.rand(1, 1, d // 2, generator=gen) * 100
    cos, sin = torch.cat((ang, ang), -1).cos().to(dt), torch.cat((ang, ang), -1).sin().to(dt)
    got = library.rms_norm_linear_rope(x, nw, EPS, w, None, cos, sin, hq + hk)
    qkv = torch.nn.functional.linear(rms_norm_reference(x, nw, EPS, False), w)
    q = qkv[..., : hq * d].view(1, 1, hq, d).transpose(1, 2)
    kk = qkv[..., hq * d : (hq + hk) * d].view(1, 1, hk, d).transpose(1, 2)
    q, kk = apply_rotary_pos_emb(q, kk, cos, sin)
    want = torch.cat(
        (q.transpose(1, 2).reshape(1, 1, -1), kk.transpose(1, 2).reshape(1, 1, -1)), dim=-1
    )
    assert torch.equal(got[..., : (hq + hk) * d], want)
    assert torch.equal(got[..., (hq + hk) * d :], qkv[..., (hq + hk) * d :])
    assert not torch.equal(got[..., : hq * d], qkv[..., : hq * d])  # something rotated


def _norm_rope_ptx(pdl: bool, has_bias: bool = True, head_norm: bool = False) -> list[str]:
    """sm_90 PTX of the kernel at `NORM_ROPE_TILE`, heads of 128 (with per-head norms or
    not), its aligned AOT arrays with rows a multiple of 16 elements (as the models' are)."""
    import dataclasses

    from cubin_ptx import ptx_lines
    from cuda.tile.compilation import KernelSignature

    from tilegym.ops import gemm

    (sigs,) = gemm.norm_rope_signatures(128, head_norm=head_norm).values()
    sig = next(s for s in sigs if s.parameters[-5].value == has_bias and s.parameters[-1].value)
    params = [
        dataclasses.replace(p, shape_divisible_by=(1,) * (p.ndim - 1) + (16,))
        if hasattr(p, "ndim")
        else p
        for p in sig.parameters
    ]
    params[-1] = pdl
    return ptx_lines(
        gemm.hinted(gemm.tilegym_norm_rope_gemv_kernel, gemm.NORM_ROPE_TILE, 1),
        KernelSignature(params, sig.calling_convention),
    )


@pytest.mark.slow
@pytest.mark.parametrize("head_norm", [False, True])
def test_norm_rope_gemv_loads_both_halves_before_the_wait_and_the_rest_after(head_norm):
    """With PDL the block's two first W tiles (one weight, two rows of tiles) are the only
    loads before `griddepcontrol.wait`; X, the norm weight, the bias, cos and sin are read and Y
    written after it (with per-head norms also their weights, the workspace and the counters).
    Without PDL there is no wait."""
    from cubin_ptx import global_accesses, instructions

    x, nw, w, b, cos, sin, qw, kw, ws, cnt, y = range(11)
    lines = _norm_rope_ptx(True, head_norm=head_norm)
    (wait,) = instructions(lines, "griddepcontrol.wait")
    accesses = global_accesses(lines)
    before = [a for a in accesses if a.line < wait]
    assert len(before) >= 2 and all(a.op.startswith("ld.") and a.arrays == {w} for a in before)
    after = [a.arrays for a in accesses if a.line > wait]
    later = (x, nw, b, cos, sin, y) + ((qw, kw, ws) if head_norm else ())
    assert all({i} in after for i in later), after
    assert any("atom" in line for line in lines) == head_norm
    assert not any("griddepcontrol" in line for line in _norm_rope_ptx(False, head_norm=head_norm))


@pytest.mark.slow
@pytest.mark.parametrize("head_norm", [False, True])
@pytest.mark.parametrize("pdl", [False, True])
def test_norm_rope_gemv_fits_eight_blocks_an_sm_without_spills(pdl, head_norm):
    """Two accumulators of 2 x 1024 products reduced every step, hinted to 8 blocks an SM: no
    spills, and at most 65536 / (8 x 128) registers."""
    from cubin_ptx import ptxas_usage

    usage = ptxas_usage(_norm_rope_ptx(pdl, head_norm=head_norm))
    assert usage.spill_stores == usage.spill_loads == 0, usage
    assert usage.registers <= 64, usage
