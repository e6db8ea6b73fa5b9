"""GeGLU (Gemma 3's MLP activation): the GELU-tanh-and-mul kernel and the gate-up GEMM with the
GELU-tanh epilogue.

CPU: the references against transformers' ``gelu_pytorch_tanh`` activation, the custom ops'
CPU and fake implementations, and the AOT signatures against the launches the default dispatch
makes. GPU: parity against fp32 references on fresh random inputs (seed printed), odd shapes,
NaN-poisoned outputs, every split-K reduction of the fused GEMM.
"""

from __future__ import annotations

import math

import cuda.tile as ct
import pytest
import torch
from transformers.activations import ACT2FN

from tilegym.ops import gelu_and_mul as gm
from tilegym.ops import library
from tilegym.ops.gemm_configs import TileConfig
from tilegym.ops.testing import assert_close_rel

SHAPES = [(1, 6912), (7, 3000), (3, 5, 1000), (2048, 6912), (17, 100)]
DTYPES = [torch.bfloat16, torch.float16]
#: one bf16 rounding of an fp32-accumulated result (as tests/ops/test_gemm.py)
GEMM_TOL = {torch.bfloat16: 8e-3, torch.float16: 2e-3}


# ------------------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_is_transformers_gelu_pytorch_tanh_then_the_product(dtype, cpu_gen):
    gate = (torch.randn(9, 130, generator=cpu_gen) * 4).to(dtype)
    up = torch.randn(9, 130, generator=cpu_gen).to(dtype)
    want = ACT2FN["gelu_pytorch_tanh"](gate) * up
    assert torch.equal(gm.gelu_tanh_and_mul_reference(gate, up), want)
    torch.testing.assert_close(gm.gelu_tanh_and_mul_reference(torch.cat([gate, up], -1)), want)
    # not SiLU: the check can fail
    assert not torch.allclose(want, torch.nn.functional.silu(gate) * up)


def test_the_kernel_formula_is_the_tanh_approximation(cpu_gen):
    """The constants the kernel uses give PyTorch's tanh GELU in fp32."""
    g = torch.randn(4096, generator=cpu_gen) * 5
    inner = gm.SQRT_2_OVER_PI * (g + gm.KAPPA * (g * g * g))
    ours = 0.5 * g * (1.0 + torch.tanh(inner))
    torch.testing.assert_close(ours, torch.nn.functional.gelu(g, approximate="tanh"))


def test_cpu_ops_and_fakes(cpu_gen):
    x = torch.randn(3, 5, 64, generator=cpu_gen)
    w = torch.randn(2 * 48, 64, generator=cpu_gen) / 8
    gate, up = torch.randn(2, 7, 48, generator=cpu_gen)
    assert torch.equal(
        library.gelu_tanh_and_mul(gate, up), gm.gelu_tanh_and_mul_reference(gate, up)
    )
    gate_up = torch.nn.functional.linear(x, w)
    want = gm.gelu_tanh_and_mul_reference(gate_up)
    assert torch.equal(library.fused_gate_up_gelu_tanh(x, w), want)
    assert want.shape == (3, 5, 48)
    from torch._subclasses.fake_tensor import FakeTensorMode

    packed = torch.cat([gate, up], -1)
    with FakeTensorMode() as mode:
        fx, fw = mode.from_tensor(x), mode.from_tensor(w)
        assert library.fused_gate_up_gelu_tanh_op(fx, fw).shape == (3, 5, 48)
        assert library.gelu_tanh_and_mul_op(mode.from_tensor(packed), None).shape == (7, 48)


def _value(param):
    """A signature parameter's compile-time value (a ConstantConstraint's), else the param."""
    return getattr(param, "value", param)


@pytest.fixture
def launches(monkeypatch):
    """Record (kernel, args) of every ct.launch instead of launching (CPU tensors)."""
    seen = []
    monkeypatch.setattr(
        ct, "launch", lambda stream, grid, kernel, args, **kw: seen.append((kernel, args))
    )
    monkeypatch.setattr(gm, "stream", lambda *a: None)
    monkeypatch.setattr(gm, "check_activation", lambda *a: None)
    return seen


def test_aot_signatures_cover_the_launches(launches):
    sizes = (6912, 100, 3000)
    for n in sizes:
        gm.gelu_tanh_and_mul(torch.zeros(3, n).bfloat16(), torch.zeros(3, n).bfloat16())
    (sigs,) = gm.aot_signatures(inter_sizes=sizes, dtypes=(torch.bfloat16,)).values()
    declared = {tuple(_value(p) for p in s.parameters[3:]) for s in sigs}
    assert declared == {tuple(args[3:]) for _, args in launches}
    assert all(kernel is gm.gelu_tanh_and_mul_kernel for kernel, _ in launches)


def test_the_gated_gemm_aot_compiles_the_gelu_epilogue():
    from tilegym.ops import gemm

    silu = gemm.aot_signatures(ops=("gated",), dtypes=(torch.bfloat16,))
    gelu = gemm.aot_signatures(ops=("gated_gelu",), dtypes=(torch.bfloat16,))
    assert set(gelu) == set(silu)
    for kernel in gelu:
        pdl_last = (gemm.tilegym_gate_up_gemv_kernel, gemm.tilegym_gate_up_silu_kernel)
        act = -2 if any(kernel is k or kernel._pyfunc is k._pyfunc for k in pdl_last) else -1
        assert {_value(s.parameters[act]) for s in gelu[kernel]} == {gemm.ACT_GELU_TANH}
        assert {_value(s.parameters[act]) for s in silu[kernel]} == {gemm.ACT_SILU}


# ------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("concatenated", [False, True])
def test_gelu_tanh_and_mul(shape, dtype, concatenated, gen, poison_empty):
    gate = torch.randn(shape, device="cuda", generator=gen).to(dtype) * 3
    up = torch.randn(shape, device="cuda", generator=gen).to(dtype)
    if concatenated:
        out = gm.gelu_tanh_and_mul(torch.cat([gate, up], dim=-1))
    else:
        out = gm.gelu_tanh_and_mul(gate, up)
    assert out.shape == shape and out.dtype == dtype
    assert_close_rel(out, gm.gelu_tanh_and_mul_reference(gate.float(), up.float()))


@pytest.mark.gpu
def test_strided_gate_and_up(gen, poison_empty):
    """Gate and up as column slices of one projection output (the unfused MLP path)."""
    gate_up = torch.randn(37, 2 * 6912, device="cuda", generator=gen).to(torch.bfloat16)
    gate, up = gate_up.chunk(2, dim=-1)
    out = gm.gelu_tanh_and_mul(gate, up)
    assert_close_rel(out, gm.gelu_tanh_and_mul_reference(gate.float(), up.float()))


def _gated_case(m, n, k, gen, config=None, dtype=torch.bfloat16):
    from tilegym.ops import gemm

    x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
    w = (torch.randn(2 * n, k, device="cuda", generator=gen) / math.sqrt(k)).to(dtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    res = gemm.fused_gate_up_gelu_tanh(x, w, out=out, config=config)
    assert res.data_ptr() == out.data_ptr()
    g, u = torch.nn.functional.linear(x.float(), w.float()).split(n, dim=-1)
    assert_close_rel(out, gm.gelu_tanh_and_mul_reference(g, u), tol=GEMM_TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 16, 300, 2049])
def test_fused_gate_up_gelu_tanh_gemma3_shapes(m, gen):
    """gemma-3-1b's MLP (hidden 1152, intermediate 6912) at decode and prefill token counts."""
    _gated_case(m, 6912, 1152, gen)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [3, 17, 2049])
def test_fused_gate_up_gelu_tanh_odd_shapes(m, gen):
    _gated_case(m, 1000, 1000, gen)
    _gated_case(m, 1000, 1000, gen, dtype=torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("reduce", ["cta", "pdl"])
@pytest.mark.parametrize("split", [2, 5, 16])
def test_fused_gate_up_gelu_tanh_split_k_twice(split, reduce, gen):
    """Both split-K reductions apply the GELU epilogue; a second call proves the counters reset."""
    cfg = TileConfig(16, 64, 128, split, reduce=reduce)
    for _ in range(2):
        _gated_case(3, 1000, 1000, gen, config=cfg)


@pytest.mark.gpu
def test_fused_gate_up_gelu_tanh_allocated_output_is_fully_written(gen, poison_empty):
    from tilegym.ops import gemm

    for m in (1, 300):
        x = torch.randn(m, 1152, device="cuda", generator=gen).to(torch.bfloat16)
        w = (torch.randn(2 * 6912, 1152, device="cuda", generator=gen) / 34).to(torch.bfloat16)
        g, u = torch.nn.functional.linear(x.float(), w.float()).split(6912, dim=-1)
        ref = gm.gelu_tanh_and_mul_reference(g, u)
        assert_close_rel(gemm.fused_gate_up_gelu_tanh(x, w), ref, tol=GEMM_TOL[torch.bfloat16])


@pytest.mark.gpu
def test_a_silu_epilogue_fails_the_gelu_reference(gen):
    """The parity check tells the two epilogues apart."""
    from tilegym.ops import gemm

    x = torch.randn(8, 1024, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(2 * 512, 1024, device="cuda", generator=gen) / 32).to(torch.bfloat16)
    g, u = torch.nn.functional.linear(x.float(), w.float()).split(512, dim=-1)
    with pytest.raises(AssertionError, match="relative error"):
        assert_close_rel(gemm.fused_gate_up_silu(x, w), gm.gelu_tanh_and_mul_reference(g, u))
