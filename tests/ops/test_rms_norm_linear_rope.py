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


def _rope_reference(qkv, cos, sin, rotated: int, norms=None, whole=None):
    """fp64 ``x * cos + rotate_half(x) * sin`` on the first ``rotated`` heads; ``norms``
    ``(q weight, k weight, q heads, unit_offset)``: each of them RMS-normed first; ``whole``
    ``(q weight, k weight, q heads)``: the q heads RMS-normed together over the whole
    projection, then the k heads (OLMo's)."""
    d = cos.shape[-1]
    heads = qkv.view(qkv.shape[0], -1, d).clone()
    c, s = cos.double()[:, None, :], sin.double()[:, None, :]
    rot = heads[:, :rotated]
    if whole is not None:
        qw, kw, nq = whole
        parts = []
        for part, w in ((rot[:, :nq], qw), (rot[:, nq:], kw)):
            flat = part.reshape(part.shape[0], -1)
            flat = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + EPS) * w.double()
            parts.append(flat.view(part.shape))
        rot = torch.cat(parts, dim=1)
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


#: (rows, q heads, kv heads, head dim, hidden): OLMo 3 7B's and OLMo 2 1B's decode, head counts
#: no multiple of `WHOLE_NORM_HEADS`, two rows
WHOLE_CASES = [
    (1, 32, 32, 128, 4096),
    (1, 16, 16, 128, 2048),
    (1, 5, 3, 64, 1000),
    (2, 6, 6, 128, 1536),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("input_norm", [False, True], ids=["no_input_norm", "input_norm"])
def test_whole_projection_norms_match_fp64(input_norm, dtype, gen):
    """OLMo's q/k norms (``HeadNorms(whole=True)``): the last block of the q projection norms
    all q heads together, the last of k's all k heads; without ``norm_weight`` no input norm
    (a post-norm layer's QKV GEMV). Three calls a shape on fresh inputs (the counters must be
    back at zero), outputs poisoned, fp32 tables (OLMo's rotary module hands them out)."""
    from tilegym.ops import gemm

    for m, hq, hk, d, k in WHOLE_CASES:
        n = (hq + 2 * hk) * d
        for call in range(3):
            x, nw, w, b = _inputs(m, n, k, gen, dtype, call == 1)
            qw = _rand((hq * d,), gen, dtype, 0.3, 1.0)
            kw = _rand((hk * d,), gen, dtype, 0.3, 1.0)
            heads = gemm.HeadNorms(qw, kw, EPS, hq, whole=True, round_once=True)
            cos, sin = _angles(m, d, gen, torch.float32)
            out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
            norm = nw if input_norm else None
            gemm.rms_norm_linear_rope(
                x, norm, EPS, w, b, cos, sin, hq + hk, head_norms=heads, out=out
            )
            qkv = _reference(x, nw, w, b, False) if input_norm else _plain(x, w, b)
            ref = _rope_reference(qkv, cos, sin, hq + hk, whole=(qw, kw, hq))
            assert_close_rel(out, ref, tol=GEMM_TOL[dtype])


def _plain(x, w, b):
    """fp64 ``x @ w.T (+ b)``."""
    out = x.double() @ w.double().T
    return out if b is None else out + b.double()


@pytest.mark.gpu
def test_whole_norms_against_olmo3s_steps(gen):
    """Against the GEMM, OLMo 3's whole-projection q_norm / k_norm (fp32 normed row times the
    weight, rounded once) and its RoPE with fp32 tables cast back to bf16, at OLMo 3 7B's
    decode shape: within about two bf16 roundings of the projection."""
    from transformers.models.olmo3.modeling_olmo3 import apply_rotary_pos_emb

    from tilegym.ops import gemm
    from tilegym.ops.qk_norm_whole_rope import whole_rms_norm_reference

    hq, hk, d, k = 32, 32, 128, 4096
    x, _, w, _ = _inputs(1, (hq + 2 * hk) * d, k, gen, torch.bfloat16, False)
    qw, kw = _rand((hq * d,), gen, torch.bfloat16, 0.3, 1.0), _rand((hk * d,), gen, torch.bfloat16)
    cos, sin = _angles(1, d, gen, torch.float32)
    heads = gemm.HeadNorms(qw, kw, EPS, hq, whole=True, round_once=True)
    fused = gemm.rms_norm_linear_rope(x, None, EPS, w, None, cos, sin, hq + hk, head_norms=heads)
    qkv = gemm.linear(x, w)
    q = whole_rms_norm_reference(qkv[:, : hq * d], qw, EPS).view(1, 1, hq, d).transpose(1, 2)
    kk = whole_rms_norm_reference(qkv[:, hq * d : (hq + hk) * d], kw, EPS)
    q, kk = apply_rotary_pos_emb(q, kk.view(1, 1, hk, d).transpose(1, 2), cos[None], sin[None])
    steps = torch.cat(
        (q.transpose(1, 2).reshape(1, -1), kk.transpose(1, 2).reshape(1, -1), qkv[:, -hk * d :]),
        dim=-1,
    )
    assert_close_rel(fused, steps.float(), tol=3 * GEMM_TOL[torch.bfloat16])


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
@pytest.mark.parametrize("head_norm", [False, True, "whole"], ids=["plain", "head_norms", "whole"])
def test_cache_write_puts_the_outputs_keys_and_values_at_the_position(head_norm, gen):
    """With a `CacheWrite` the new token's rotated keys and its values land in slot
    ``position[0]`` of each batch row's caches, bit for bit what the kernel stored in Y; every
    other slot keeps its (random) value, and the length becomes position + 1. Three calls at
    random positions; the output still matches fp64."""
    from tilegym.ops import gemm

    for m, hq, hk, d, k in [(1, 16, 8, 128, 1024), (2, 5, 5, 64, 1000), (1, 32, 8, 64, 2048)]:
        n, cap = (hq + 2 * hk) * d, 300
        keys = torch.randn(m, hk, cap, d, device="cuda", generator=gen).to(torch.bfloat16)
        values = torch.randn(m, hk, cap, d, device="cuda", generator=gen).to(torch.bfloat16)
        length = torch.full((), -7, dtype=torch.int64, device="cuda")
        for _ in range(3):
            x, nw, w, b = _inputs(m, n, k, gen, torch.bfloat16, m == 2)
            cos, sin = _angles(m, d, gen, torch.bfloat16)
            p = int(torch.randint(0, cap, (1,), generator=gen, device="cuda"))
            position = torch.tensor([p], dtype=torch.int32, device="cuda")
            heads, norms, whole = None, None, None
            if head_norm == "whole":
                qw = _rand((hq * d,), gen, torch.bfloat16, 0.3, 1.0)
                kw = _rand((hk * d,), gen, torch.bfloat16, 0.3, 1.0)
                heads, whole = gemm.HeadNorms(qw, kw, EPS, hq, whole=True), (qw, kw, hq)
            elif head_norm:
                qw, kw = (_rand((d,), gen, torch.bfloat16, 0.3, 1.0) for _ in range(2))
                heads, norms = gemm.HeadNorms(qw, kw, EPS, hq), (qw, kw, hq, False)
            before_k, before_v = keys.clone(), values.clone()
            write = gemm.CacheWrite(keys, values, position, length, hq)
            out = gemm.rms_norm_linear_rope(
                x, nw, EPS, w, b, cos, sin, hq + hk, head_norms=heads, cache=write
            )
            qkv = _reference(x, nw, w, b, False)
            ref = _rope_reference(qkv, cos, sin, hq + hk, norms, whole)
            assert_close_rel(out, ref, tol=GEMM_TOL[torch.bfloat16])
            heads_out = out.view(m, -1, d)
            before_k[:, :, p] = heads_out[:, hq : hq + hk]
            before_v[:, :, p] = heads_out[:, hq + hk :]
            assert torch.equal(keys, before_k) and torch.equal(values, before_v)
            assert int(length) == p + 1


@pytest.mark.gpu
@pytest.mark.parametrize("whole", [False, True], ids=["per_head", "whole"])
def test_head_norms_in_a_captured_graph_use_the_reserved_counters(whole, gen):
    """Captured as the compiled decode step runs it (``private_buffers()``), after
    `reserve_counters`: the graph replays right three times on fresh inputs (the kernel leaves
    the counters at zero) and holds no memset for them."""
    from tilegym.ops import gemm
    from tilegym.ops._common import private_buffers

    hq, hk, d, k = 16, 8, 128, 1024
    n = (hq + 2 * hk) * d
    x, nw, w, _ = _inputs(1, n, k, gen, torch.bfloat16, False)
    qw = _rand((hq * d if whole else d,), gen, torch.bfloat16, 0.3, 1.0)
    kw = _rand((hk * d if whole else d,), gen, torch.bfloat16, 0.3, 1.0)
    cos, sin = _angles(1, d, gen, torch.bfloat16)
    heads = gemm.HeadNorms(qw, kw, EPS, hq, whole=whole)
    gemm.reserve_counters(x.device)
    out = torch.full((1, n), float("nan"), device="cuda", dtype=torch.bfloat16)

    def step():
        with private_buffers():
            gemm.rms_norm_linear_rope(
                x, nw, EPS, w, None, cos, sin, hq + hk, head_norms=heads, out=out
            )

    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):
        fresh, _, _, _ = _inputs(1, n, k, gen, torch.bfloat16, False)
        x.copy_(fresh)
        out.fill_(float("nan"))
        graph.replay()
        qkv = _reference(x, nw, w, None, False)
        if whole:
            ref = _rope_reference(qkv, cos, sin, hq + hk, whole=(qw, kw, hq))
        else:
            ref = _rope_reference(qkv, cos, sin, hq + hk, (qw, kw, hq, False))
        assert_close_rel(out, ref, tol=GEMM_TOL[torch.bfloat16])


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
    keys = torch.zeros(1, 4, 16, 64, dtype=torch.bfloat16, device="cuda")
    at = torch.zeros(1, dtype=torch.int32, device="cuda")
    length = torch.zeros((), dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError, match="12 heads are not 6 q, 2 k and 2 v"):
        write = gemm.CacheWrite(keys[:, :2], keys[:, :2], at, length, 6)
        gemm.rms_norm_linear_rope(x, nw, EPS, w, None, cos, sin, 8, cache=write)
    with pytest.raises(ValueError, match="position must be int32"):
        write = gemm.CacheWrite(keys, keys, at.long(), length, 4)
        gemm.rms_norm_linear_rope(x, nw, EPS, w, None, cos, sin, 8, cache=write)
    with pytest.raises(ValueError, match=r"head norm weights must be contiguous \(256,\)"):
        per_head = _rand((64,), gen, torch.bfloat16)
        whole = gemm.HeadNorms(per_head, per_head, EPS, 4, whole=True)
        gemm.rms_norm_linear_rope(x, None, EPS, w, None, cos, sin, 8, head_norms=whole)
    with pytest.raises(ValueError, match=r"whole-projection q/k norms have no 1 \+ weight form"):
        four = _rand((4 * 64,), gen, torch.bfloat16)
        whole = gemm.HeadNorms(four, four, EPS, 4, unit_offset=True, whole=True)
        gemm.rms_norm_linear_rope(x, None, EPS, w, None, cos, sin, 8, head_norms=whole)


@pytest.mark.slow
@pytest.mark.parametrize("cache_write", [False, True])
@pytest.mark.parametrize(
    "head_dim,head_norm", [(64, False), (128, False), (128, True), (128, "whole")]
)
def test_norm_rope_signatures_compile(head_dim, head_norm, cache_write):
    """The AOT signatures (bias x PDL) compile for sm_90, with and without per-head norms (and
    OLMo's form: whole-projection norms, no input norm, fp32 tables), with and without the
    KV-cache write."""
    from cuda.tile.compilation import export_kernel

    from tilegym.ops import gemm

    olmo = dict(norm=False, whole=True, cos_dtype=torch.float32) if head_norm == "whole" else {}
    sigs = gemm.norm_rope_signatures(
        head_dim, head_norm=bool(head_norm), cache_write=cache_write, **olmo
    )
    (kernel,) = sigs
    assert len(sigs[kernel]) == 4
    buf = io.BytesIO()
    export_kernel(kernel, sigs[kernel], buf, gpu_code="sm_90", output_format="cubin")
    assert len(buf.getvalue()) > 1000


@pytest.mark.parametrize(
    "whole,widths,offset,message",
    [
        (True, (256, 128), False, None),
        (True, (64, 64), False, r"must be contiguous \(256,\)"),
        (True, (256, 128), True, r"no 1 \+ weight form"),
        (False, (64, 64), True, None),
        (False, (256, 128), False, r"must be contiguous \(64,\)"),
    ],
)
def test_head_norm_weights_are_checked_by_their_form(whole, widths, offset, message):
    """Per-head norms take ``[D]`` weights, whole-projection ones ``[heads * D]`` (4 q and 2 k
    heads of 64 here) and no ``1 + weight`` form; a mismatch is one ValueError."""
    from tilegym.ops import gemm

    qw, kw = (torch.ones(n, dtype=torch.bfloat16) for n in widths)
    heads = gemm.HeadNorms(qw, kw, EPS, 4, unit_offset=offset, whole=whole)
    if message is None:
        gemm._check_head_norms(heads, torch.bfloat16, 64, 6)
    else:
        with pytest.raises(ValueError, match=message):
            gemm._check_head_norms(heads, torch.bfloat16, 64, 6)


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


def test_the_cpu_cache_write_is_the_kv_write_of_the_outputs_heads():
    """On a CPU the cache form returns what the plain form returns and writes its key and
    value heads at ``position[0]`` of each batch row, as `kv_cache_write_at` would, and sets
    the length; its custom op passes opcheck (schema, fake, mutations)."""
    from tilegym.ops import gemm, library
    from tilegym.ops.kv_cache import reference_kv_cache_write_at

    gen = torch.Generator().manual_seed(1)
    rows, hq, hk, d, k, cap = 2, 4, 2, 16, 48, 9
    dt = torch.bfloat16
    x = torch.randn(rows, 1, k, generator=gen).to(dt)
    nw = (1 + 0.1 * torch.randn(k, generator=gen)).to(dt)
    w = (torch.randn((hq + 2 * hk) * d, k, generator=gen) / math.sqrt(k)).to(dt)
    ang = torch.rand(rows, 1, d // 2, generator=gen) * 100
    cos, sin = torch.cat((ang, ang), -1).cos().to(dt), torch.cat((ang, ang), -1).sin().to(dt)
    keys, values = (torch.randn(rows, hk, cap, d, generator=gen).to(dt) for _ in range(2))
    position, length = torch.tensor([5], dtype=torch.int32), torch.tensor(0)
    want_k, want_v, want_len = keys.clone(), values.clone(), length.clone()
    write = gemm.CacheWrite(keys, values, position, length, hq)
    got = library.rms_norm_linear_rope(x, nw, EPS, w, None, cos, sin, hq + hk, cache=write)
    plain = library.rms_norm_linear_rope(x, nw, EPS, w, None, cos, sin, hq + hk)
    assert torch.equal(got, plain)
    heads = plain.view(rows, 1, -1, d).transpose(1, 2)
    k_new, v_new = heads[:, hq : hq + hk], heads[:, hq + hk :]
    reference_kv_cache_write_at(k_new, v_new, want_k, want_v, position, want_len)
    assert torch.equal(keys, want_k) and torch.equal(values, want_v)
    assert int(length) == int(want_len) == 6
    args = (x, nw, EPS, w, None, cos, sin, hq + hk, keys, values, position, length, hq)
    torch.library.opcheck(torch.ops.tilegym.rms_norm_linear_rope_cache.default, args)


def test_kept_counters_are_the_reserved_ones_even_in_private_buffers():
    """Inside ``private_buffers()`` (the compiled path) the per-head norms' counters are fresh
    zeroed tensors until `reserve_counters` makes the process-wide ones, then always those
    (no fill node in a captured graph); a request larger than them still gets its own."""
    from tilegym.ops import gemm
    from tilegym.ops._common import private_buffers

    buffers, cpu = gemm._DeviceBuffers(), torch.device("cpu")
    with private_buffers():
        a, b = buffers.kept_counters(cpu, 8), buffers.kept_counters(cpu, 8)
        assert a is not b and not a.any()
        buffers.reserve_counters(cpu)
        kept = buffers.kept_counters(cpu, 8)
        assert kept is buffers.kept_counters(cpu, 24) and kept.numel() == gemm._COUNTER_SLOTS
        assert buffers.kept_counters(cpu, gemm._COUNTER_SLOTS + 1) is not kept
    buffers.reserve_counters(cpu)
    assert buffers.kept_counters(cpu, 1) is kept


def _norm_rope_ptx(
    pdl: bool, head_norm: bool = False, cache_write: bool = False, whole: bool = False
) -> list[str]:
    """sm_90 PTX of the kernel at `NORM_ROPE_TILE` with a bias, heads of 128 (with per-head
    norms or not, with the KV-cache write or not; ``whole``: OLMo's whole-projection norms, no
    input norm, fp32 tables), its aligned AOT arrays with rows a multiple of 16 elements (as
    the models' are)."""
    import dataclasses

    from cubin_ptx import ptx_lines
    from cuda.tile.compilation import KernelSignature

    from tilegym.ops import gemm

    olmo = dict(norm=False, whole=True, cos_dtype=torch.float32) if whole else {}
    forms = gemm.norm_rope_signatures(
        128, head_norm=head_norm or whole, cache_write=cache_write, **olmo
    )
    (sigs,) = forms.values()
    sig = next(s for s in sigs if s.parameters[-8].value and s.parameters[-1].value)
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
@pytest.mark.parametrize("cache_write", [False, True])
@pytest.mark.parametrize("head_norm", [False, True])
def test_norm_rope_gemv_loads_both_halves_before_the_wait_and_the_rest_after(
    head_norm, cache_write
):
    """With PDL the block's two first W tiles (one weight, two rows of tiles) are the only
    loads before `griddepcontrol.wait`; X, the norm weight, the bias, cos and sin are read and Y
    written after it (with per-head norms also their weights, the workspace and the counters;
    with the KV-cache write the position, both caches and the length). Without PDL there is no
    wait."""
    from cubin_ptx import global_accesses, instructions

    x, nw, w, b, cos, sin, qw, kw, ws, cnt, y, y3, kc, vc, pos, length = range(16)
    lines = _norm_rope_ptx(True, head_norm, cache_write)
    (wait,) = instructions(lines, "griddepcontrol.wait")
    accesses = global_accesses(lines)
    before = [a for a in accesses if a.line < wait]
    assert len(before) >= 2 and all(a.op.startswith("ld.") and a.arrays == {w} for a in before)
    after = [a.arrays for a in accesses if a.line > wait]
    later = (x, nw, b, cos, sin, y) + ((qw, kw, ws) if head_norm else ())
    later += (pos, kc, vc, length) if cache_write else ()
    assert all({i} in after for i in later), after
    if not cache_write:
        assert all(not a & {kc, vc, pos, length} for a in after), after
    assert any("atom" in line for line in lines) == head_norm
    assert not any("griddepcontrol" in line for line in _norm_rope_ptx(False, head_norm))


@pytest.mark.slow
@pytest.mark.parametrize("cache_write", [False, True])
@pytest.mark.parametrize("head_norm", [False, True, "whole"])
@pytest.mark.parametrize("pdl", [False, True])
def test_norm_rope_gemv_fits_eight_blocks_an_sm_without_spills(pdl, head_norm, cache_write):
    """Two accumulators of 2 x 1024 products reduced every step, hinted to 8 blocks an SM: no
    spills, and at most 65536 / (8 x 128) registers, with the KV-cache write too, and with
    OLMo's whole-projection norms (`WHOLE_NORM_HEADS` heads a step in the last block)."""
    from cubin_ptx import ptxas_usage

    whole = head_norm == "whole"
    usage = ptxas_usage(_norm_rope_ptx(pdl, bool(head_norm), cache_write, whole))
    assert usage.spill_stores == usage.spill_loads == 0, usage
    assert usage.registers <= 64, usage
