"""``add_norm_gate_up.add_rms_norm_gate_up``: a post-norm layer's attention norm, residual add
and MLP gate/up GEMV in one launch (``tilegym_add_norm_gate_up_gemv_kernel``).

GPU tests: against fp64 (``h = r + RMSNorm(o)``, then SiLU / GELU-tanh gate times up) on fresh
random inputs at OLMo 3 7B's and OLMo 2 1B's decode shapes and an odd one, bf16 and fp16,
Gemma's ``1 + weight``; the stored ``h`` against ``rms_norm_add``'s kernel; several rows take
the two-launch path; the programmatic-dependent launch's wait; bad inputs as one
``ValueError``. CPU tests: the AOT signatures compile for sm_90 without spills, only the
weights are read before the wait, and the CPU reference is the upstream layer's steps.
"""

from __future__ import annotations

import pytest
import torch
from test_gemm import GEMM_TOL
from test_rms_norm_linear import EPS, _check_with_x_written_late, _rand

from tilegym.ops.testing import assert_close_rel

#: (rows, hidden, intermediate): OLMo 3 7B's and OLMo 2 1B's decode, an odd K and width
CASES = [(1, 4096, 11008), (1, 2048, 8192), (1, 1000, 1002)]


def _inputs(m, k, i, gen, dtype):
    o = _rand((m, k), gen, dtype, 3.0)  # far from unit RMS: the norm must act
    r = _rand((m, k), gen, dtype)
    nw = _rand((k,), gen, dtype, 0.2, 1.0)
    w = _rand((2 * i, k), gen, dtype, 1 / k**0.5)
    return o, r, nw, w


def _reference(o, r, nw, w, gelu=False, unit_offset=False):
    """fp64 ``h = r + RMSNorm(o)`` (no rounding on the way), then the gated projection."""
    od = o.double()
    normed = od * torch.rsqrt(od.pow(2).mean(-1, keepdim=True) + EPS)
    h = r.double() + normed * (1.0 + nw.double() if unit_offset else nw.double())
    gate, up = (h @ w.double().T).chunk(2, dim=-1)
    act = torch.nn.functional.gelu(gate, approximate="tanh") if gelu else gate * torch.sigmoid(gate)
    return act * up, h


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gelu", [False, True], ids=["silu", "gelu_tanh"])
@pytest.mark.parametrize("unit_offset", [False, True])
def test_matches_fp64_and_stores_the_sum_as_rms_norm_add(unit_offset, gelu, dtype, gen):
    """Three calls a shape on fresh inputs; ``h`` is within two roundings of ``rms_norm_add``'s
    (its own rsqrt, summed in another order)."""
    from tilegym.ops import gemm, rms_norm
    from tilegym.ops.add_norm_gate_up import add_rms_norm_gate_up

    act = gemm.ACT_GELU_TANH if gelu else gemm.ACT_SILU
    for m, k, i in CASES:
        for _ in range(3):
            o, r, nw, w = _inputs(m, k, i, gen, dtype)
            out, h = add_rms_norm_gate_up(o, r, nw, EPS, w, act=act, unit_offset=unit_offset)
            want, want_h = _reference(o, r, nw, w, gelu, unit_offset)
            assert out.shape == (m, i) and h.shape == (m, k)
            assert_close_rel(out, want, tol=GEMM_TOL[dtype])
            two_step = rms_norm.rms_norm_add(o, r, nw, EPS, unit_offset=unit_offset)[0]
            _assert_within_two_roundings(h, two_step, r)
            assert_close_rel(h, want_h, tol=GEMM_TOL[dtype])


def _assert_within_two_roundings(h, two_step, r):
    """Each element of ``h`` within one rounding of the normed branch plus one of the sum of
    ``two_step``'s (a one-ulp difference in the rounded norm survives the add: an fp16 run
    differed by 0.24% of a sum that cancelled, 12-07)."""
    eps = torch.finfo(h.dtype).eps
    want = two_step.double()
    branch = (want - r.double()).abs()
    bound = eps * (want.abs() + branch)
    assert ((h.double() - want).abs() <= bound).all(), (h.double() - want).abs().max()


@pytest.mark.gpu
def test_several_rows_take_the_two_launches(gen):
    from tilegym.ops import gemm, rms_norm
    from tilegym.ops.add_norm_gate_up import add_rms_norm_gate_up

    o, r, nw, w = _inputs(3, 1024, 768, gen, torch.bfloat16)
    out, h = add_rms_norm_gate_up(o, r, nw, EPS, w)
    two_step = rms_norm.rms_norm_add(o, r, nw, EPS)[0]
    assert torch.equal(h, two_step)
    assert torch.equal(out, gemm.fused_gate_up_silu(two_step, w))


@pytest.mark.gpu
def test_pdl_waits_for_the_kernel_writing_the_branch(gen, monkeypatch):
    """Both weights' first tiles before the wait, the attention output (written late) after
    it; the first call reads the weight without PDL, the next ones with it."""
    from tilegym.ops import gemm
    from tilegym.ops.add_norm_gate_up import add_rms_norm_gate_up

    monkeypatch.setattr(gemm, "GEMV_PDL", True)
    o, r, nw, w = _inputs(1, 3072, 2048, gen, torch.bfloat16)
    ref, _ = _reference(o, r, nw, w)
    _check_with_x_written_late(
        o, ref, lambda x, out: out.copy_(add_rms_norm_gate_up(x, r, nw, EPS, w)[0])
    )


@pytest.mark.gpu
def test_bad_inputs_are_one_clear_error(gen):
    from tilegym.ops.add_norm_gate_up import add_rms_norm_gate_up

    o, r, nw, w = _inputs(1, 256, 64, gen, torch.bfloat16)
    with pytest.raises(ValueError, match="not two halves of 2-row tiles"):
        add_rms_norm_gate_up(o, r, nw, EPS, w[:126])
    with pytest.raises(ValueError, match="residual torch.float32"):
        add_rms_norm_gate_up(o, r.float(), nw, EPS, w)
    with pytest.raises(ValueError, match=r"norm weight must be a CUDA tensor of shape \(256,\)"):
        add_rms_norm_gate_up(o, r, nw[:128], EPS, w)


def test_the_cpu_reference_is_the_post_norm_layers_steps():
    """On a CPU the op's reference is OLMo 3's ``residual + post_attention_layernorm(o)`` (as
    ``rms_norm_add`` rounds it) and the MLP's ``act(gate_proj(h)) * up_proj(h)``."""
    from tilegym.ops.add_norm_gate_up import add_rms_norm_gate_up_reference
    from tilegym.ops.rms_norm import rms_norm_add_reference

    gen = torch.Generator().manual_seed(3)
    o, r = torch.randn(2, 64, generator=gen) * 3, torch.randn(2, 64, generator=gen)
    nw, w = torch.rand(64, generator=gen) + 0.5, torch.randn(2 * 48, 64, generator=gen) / 8
    out, h = add_rms_norm_gate_up_reference(o, r, nw, EPS, w)
    want_h = rms_norm_add_reference(o, r, nw, EPS)[0]
    assert torch.equal(h, want_h)
    gate, up = want_h @ w[:48].T, want_h @ w[48:].T
    torch.testing.assert_close(out, torch.nn.functional.silu(gate) * up)


def _ptx(pdl: bool) -> list[str]:
    """sm_90 PTX of the aligned AOT signature with rows a multiple of 16 elements (as the
    models' are)."""
    import dataclasses

    from cubin_ptx import ptx_lines
    from cuda.tile.compilation import KernelSignature

    from tilegym.ops import add_norm_gate_up as m
    from tilegym.ops.gemm import hinted

    ((kernel, sigs),) = m.aot_signatures().items()
    sig = next(s for s in sigs if s.parameters[-1].value == pdl)
    params = [
        dataclasses.replace(p, shape_divisible_by=(1,) * (p.ndim - 1) + (16,))
        if hasattr(p, "ndim")
        else p
        for p in sig.parameters
    ]
    return ptx_lines(hinted(kernel, m.TILE, 1), KernelSignature(params, sig.calling_convention))


@pytest.mark.slow
def test_the_pdl_form_fits_eight_blocks_an_sm_without_spills():
    """The form a decode step runs (PDL, once the weight is ready): 64 registers at most and no
    spills; the plain form (the first call) may spill a little (`TILE`'s note)."""
    from cubin_ptx import ptxas_usage

    usage = ptxas_usage(_ptx(True))
    assert usage.spill_stores == usage.spill_loads == 0, usage
    assert usage.registers <= 64, usage


@pytest.mark.slow
def test_only_the_weights_are_read_before_the_wait():
    """With PDL the two weights' first tiles are the only loads before ``griddepcontrol.wait``;
    the residual, the branch, the norm weight are read and Y and H written after it."""
    from cubin_ptx import global_accesses, instructions

    r, x, nw, wg, wu, y, h = range(7)
    lines = _ptx(True)
    (wait,) = instructions(lines, "griddepcontrol.wait")
    accesses = global_accesses(lines)
    before = [a for a in accesses if a.line < wait]
    assert len(before) >= 2 and all(a.op.startswith("ld.") for a in before)
    assert {i for a in before for i in a.arrays} == {wg, wu}
    after = [a.arrays for a in accesses if a.line > wait]
    assert all({i} in after for i in (r, x, nw, y, h)), after
