"""``gemm.rms_norm_linear`` and ``gemm.rms_norm_gate_up``: a layer's RMSNorm in the GEMM after it.

GPU tests: the norm-prologue GEMVs against an fp64 norm and GEMM on fresh random inputs (odd
N and K, K above and below the tile, bias, Gemma's ``1 + weight``, SiLU and GELU-tanh, bf16 and
fp16, outputs poisoned), the same against transformers' rounded two-step form, the many-row
fallback, and the programmatic-dependent launch's wait. CPU tests: the AOT signatures compile
for sm_90 and the PTX orders the weights' first loads before the wait, X after it.
"""

from __future__ import annotations

import dataclasses
import io
import math

import cuda.tile as ct
import pytest
import torch
from cubin_ptx import global_accesses, instructions, ptx_lines
from test_gemm import GEMM_TOL, _copy_late

from tilegym.ops.gelu_and_mul import gelu_tanh_and_mul_reference
from tilegym.ops.gemm_configs import TileConfig
from tilegym.ops.testing import assert_close_rel

NORM_GEMV_CONFIGS = [
    TileConfig(1, 4, 1024, gemv=True),  # products kept over K steps (GEMV_ACC_ELEMS)
    TileConfig(1, 8, 1024, gemv=True),  # reduced every K step
    TileConfig(1, 2, 512, gemv=True, latency=1),
    TileConfig(4, 16, 256, gemv=True),
]
#: (M, N, K): qwen3's QKV at decode, llama's, odd N and K below / above the K tile
SHAPES = [(1, 4096, 1024), (1, 3072, 2048), (1, 1021, 3000), (3, 5, 1000)]
EPS = 1e-6


def _rand(shape, gen, dtype, scale=1.0, shift=0.0):
    return (torch.randn(shape, device="cuda", generator=gen) * scale + shift).to(dtype)


def _inputs(m, n, k, gen, dtype, bias):
    x = _rand((m, k), gen, dtype, 3.0)  # rows far from unit RMS: the norm must act
    nw = _rand((k,), gen, dtype, 0.2, 1.0)
    w = _rand((n, k), gen, dtype, 1 / math.sqrt(k))
    b = _rand((n,), gen, dtype) if bias else None
    return x, nw, w, b


def _reference(x, nw, w, b, unit_offset):
    """fp64 norm (no intermediate rounding), fp32-exact GEMM."""
    xd = x.double()
    normed = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS)
    normed = normed * (1.0 + nw.double() if unit_offset else nw.double())
    out = normed @ w.double().T
    return out if b is None else out + b.double()


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", NORM_GEMV_CONFIGS, ids=lambda c: f"{c.tm}x{c.tn}x{c.tk}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("unit_offset", [False, True])
def test_norm_gemv_matches_fp64(cfg, dtype, unit_offset, gen):
    from tilegym.ops import gemm

    for m, n, k in SHAPES:
        for bias in (False, True):
            x, nw, w, b = _inputs(m, n, k, gen, dtype, bias)
            out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
            res = gemm.rms_norm_linear(
                x, nw, EPS, w, b, unit_offset=unit_offset, out=out, config=cfg
            )
            assert res.data_ptr() == out.data_ptr()
            assert_close_rel(out, _reference(x, nw, w, b, unit_offset), tol=GEMM_TOL[dtype])


@pytest.mark.gpu
def test_norm_gemv_against_the_two_launches(gen):
    """The fused form differs from RMSNorm (rounded as transformers does) then the GEMM by
    about one bf16 rounding of the normed row, no more; the default (table) config."""
    from tilegym.ops import gemm
    from tilegym.ops.rms_norm import rms_norm

    for m, n, k in SHAPES:
        x, nw, w, b = _inputs(m, n, k, gen, torch.bfloat16, True)
        fused = gemm.rms_norm_linear(x, nw, EPS, w, b)
        two = gemm.linear(rms_norm(x, nw, EPS), w, b)
        assert_close_rel(fused, two.float(), tol=2 * GEMM_TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("m", [2, 8, 300])
def test_many_rows_take_the_norm_then_the_gemm(m, gen):
    """Rows the table gives to the mma kernels: the norm kernel, then the GEMM."""
    from tilegym.ops import gemm

    x, nw, w, b = _inputs(m, 1021, 1000, gen, torch.bfloat16, True)
    out = torch.full((m, 1021), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm.rms_norm_linear(x, nw, EPS, w, b, out=out)
    assert_close_rel(out, _reference(x, nw, w, b, False), tol=GEMM_TOL[torch.bfloat16])


@pytest.mark.gpu
def test_bad_norm_weight_is_one_clear_error(gen):
    from tilegym.ops import gemm

    x, nw, w, _ = _inputs(1, 64, 128, gen, torch.bfloat16, False)
    with pytest.raises(ValueError, match=r"norm weight must be a CUDA tensor of shape \(128,\)"):
        gemm.rms_norm_linear(x, nw[:64], EPS, w)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", NORM_GEMV_CONFIGS[:2], ids=["sum_last", "sum_each"])
def test_norm_gemv_pdl_waits_for_the_kernel_writing_x(cfg, gen, monkeypatch):
    """With `GEMV_PDL` the kernel loads its first W tile before waiting for the kernel before
    it; X (written late by that kernel) must be read after the wait. Outputs poisoned; the
    first call reads W without PDL (`_pdl_ready`), the next ones with it."""
    from tilegym.ops import gemm

    monkeypatch.setattr(gemm, "GEMV_PDL", True)
    dt = torch.bfloat16
    n, k = 1021, 3072
    src, nw, w, b = _inputs(1, n, k, gen, dt, True)
    ref = _reference(src, nw, w, b, False)
    _check_with_x_written_late(
        src, ref, lambda x, out: gemm.rms_norm_linear(x, nw, EPS, w, b, out=out, config=cfg)
    )


def _check_with_x_written_late(src, ref, call) -> None:
    """``call(x, out)`` three times, each right after a kernel that writes x = src some 100 us
    late (and lets its dependents start at once); outputs poisoned, compared with ``ref``."""
    from tilegym.ops._common import stream

    x = torch.empty_like(src)
    for _ in range(3):
        x.fill_(float("nan"))
        grid = (math.ceil(src.shape[1] / 1024), 1, 1)
        ct.launch(stream(), grid, _copy_late, (src, x, 1 << 17, 1024))
        out = torch.full(ref.shape, float("nan"), device="cuda", dtype=src.dtype)
        call(x, out)
        assert_close_rel(out, ref, tol=GEMM_TOL[src.dtype])


def _compiled_ptx(op: str, count: int):
    """The op's AOT signatures (``count`` of them) compile for sm_90; returns a function of
    (flags after the tile constants) -> sm_90 PTX lines of the aligned signature with 16-byte
    row strides, as the models' tensors are."""
    from cuda.tile.compilation import KernelSignature, export_kernel

    from tilegym.ops import gemm

    sigs = gemm.aot_signatures((op,), (torch.bfloat16,))
    (kernel,) = sigs
    assert len(sigs[kernel]) == count
    buf = io.BytesIO()
    export_kernel(kernel, sigs[kernel][:1], buf, gpu_code="sm_90", output_format="cubin")
    assert len(buf.getvalue()) > 1000
    (aligned, *_) = [s for s in sigs[kernel] if s.parameters[0].base_addr_divisible_by == 16]
    arrays = [
        dataclasses.replace(a, shape_divisible_by=(1,) * (a.ndim - 1) + (8,))
        for a in aligned.parameters[:5]
    ]

    def ptx(*flags) -> list[str]:
        params = [*arrays, *aligned.parameters[5:10], *flags]
        return ptx_lines(kernel, KernelSignature(params, aligned.calling_convention))

    return ptx


def _loads_around_the_wait(lines, weights: set[int], later: tuple[int, ...]) -> None:
    """Every global access before ``griddepcontrol.wait`` loads one of ``weights`` (all of
    them are loaded there); each array of ``later`` is read after it."""
    (wait,) = instructions(lines, "griddepcontrol.wait")
    accesses = global_accesses(lines)
    before = [a for a in accesses if a.line < wait]
    assert before and all(a.op.startswith("ld.") and a.arrays <= weights for a in before), before
    assert {i for a in before for i in a.arrays} == weights
    after = [a.arrays for a in accesses if a.line > wait]
    assert all({i} in after for i in later)


@pytest.mark.slow
def test_norm_gemv_signatures_compile_and_load_w_before_the_wait():
    """The AOT signatures (2 alignments x bias x PDL) compile for sm_90; with PDL the first W
    tile's loads precede `griddepcontrol.wait` and X and the norm weight are read after it."""
    ptx = _compiled_ptx("norm", 8)
    _loads_around_the_wait(ptx(True, False, True), {2}, (0, 1))  # X, NW, W, B, Y
    assert not any("griddepcontrol" in line for line in ptx(True, False, False))


NORM_GATE_UP_CONFIGS = [
    None,  # the function's own one-row tile (gemm.NORM_GATE_UP_TILE)
    TileConfig(1, 4, 512, gemv=True),
    TileConfig(4, 2, 256, gemv=True),
]
#: (M, I, K): qwen3's and llama's gate/up at decode, odd I and K, a few rows
GATE_UP_SHAPES = [(1, 3072, 1024), (1, 8192, 2048), (1, 1021, 3000), (3, 5, 1000)]


def _gate_up_reference(x, nw, w, unit_offset, gelu):
    i = w.shape[0] // 2
    gate_up = _reference(x, nw, w, None, unit_offset)
    if gelu:
        return gelu_tanh_and_mul_reference(gate_up)
    gate, up = gate_up[..., :i], gate_up[..., i:]
    return torch.nn.functional.silu(gate) * up


@pytest.mark.gpu
@pytest.mark.parametrize(
    "cfg", NORM_GATE_UP_CONFIGS, ids=lambda c: "own" if c is None else f"{c.tm}x{c.tn}x{c.tk}"
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("unit_offset", [False, True])
@pytest.mark.parametrize("gelu", [False, True], ids=["silu", "gelu_tanh"])
def test_norm_gate_up_matches_fp64(cfg, dtype, unit_offset, gelu, gen):
    from tilegym.ops import gemm

    act = gemm.ACT_GELU_TANH if gelu else gemm.ACT_SILU
    for m, i, k in GATE_UP_SHAPES:
        if m > 1 and cfg is None:
            continue  # more rows without a GEMV tile take the two launches (tested below)
        x, nw, w, _ = _inputs(m, 2 * i, k, gen, dtype, False)
        out = torch.full((m, i), float("nan"), device="cuda", dtype=dtype)
        res = gemm.rms_norm_gate_up(
            x, nw, EPS, w, act=act, unit_offset=unit_offset, out=out, config=cfg
        )
        assert res.data_ptr() == out.data_ptr()
        ref = _gate_up_reference(x, nw, w, unit_offset, gelu)
        assert_close_rel(out, ref, tol=GEMM_TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("m", [2, 8, 300])
def test_norm_gate_up_many_rows_take_the_norm_then_the_gemm(m, gen):
    from tilegym.ops import gemm

    x, nw, w, _ = _inputs(m, 2 * 1021, 1000, gen, torch.bfloat16, False)
    out = torch.full((m, 1021), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm.rms_norm_gate_up(x, nw, EPS, w, out=out)
    ref = _gate_up_reference(x, nw, w, False, False)
    assert_close_rel(out, ref, tol=GEMM_TOL[torch.bfloat16])


@pytest.mark.gpu
def test_norm_gate_up_pdl_waits_for_the_kernel_writing_x(gen, monkeypatch):
    """As for the QKV GEMV: both weights' first tiles before the wait, X (written late) after;
    the first call reads the weight without PDL, the next ones with it."""
    from tilegym.ops import gemm

    monkeypatch.setattr(gemm, "GEMV_PDL", True)
    dt = torch.bfloat16
    i, k = 1021, 3072
    src, nw, w, _ = _inputs(1, 2 * i, k, gen, dt, False)
    ref = _gate_up_reference(src, nw, w, False, False)
    _check_with_x_written_late(
        src, ref, lambda x, out: gemm.rms_norm_gate_up(x, nw, EPS, w, out=out)
    )


@pytest.mark.slow
def test_norm_gate_up_signatures_compile_and_load_weights_before_the_wait():
    """The AOT signatures (2 alignments x PDL) compile; with PDL both weights' first tiles
    are loaded before the wait, X and the norm weight after it."""
    from tilegym.ops import gemm

    ptx = _compiled_ptx("norm_gated", 4)
    _loads_around_the_wait(ptx(False, gemm.ACT_SILU, True), {2, 3}, (0, 1))  # X, NW, WG, WU, Y
    assert not any("griddepcontrol" in line for line in ptx(False, gemm.ACT_SILU, False))
