"""Causal conv1d (+ its cache state) and the gated RMSNorm of Qwen3.5's linear attention: the
references against transformers' functions (CPU), AOT signatures against the launches (CPU),
the cuTile kernels against the references (GPU)."""

from __future__ import annotations

import cuda.tile as ct
import pytest
import torch

from tilegym.ops import causal_conv1d as cc
from tilegym.ops import rms_norm_gated as rg
from tilegym.ops.testing import assert_close_rel, launch_fits

qwen3_5 = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")


def _conv_inputs(bsz, n_tok, ch, gen, device="cpu", dtype=torch.float32, kw=4):
    x = torch.randn(bsz, n_tok, ch, generator=gen, device=device).to(dtype)
    w = (torch.randn(ch, kw, generator=gen, device=device) * 0.5).to(dtype)
    state = torch.randn(bsz, ch, kw, generator=gen, device=device).to(dtype)
    return x, w, state


# ---------------------------------------------------------------------------------------------
# CPU: references vs transformers
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_tok", [1, 2, 3, 4, 5, 17])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_reference_matches_transformers(n_tok, dtype, gen):
    x, w, state = _conv_inputs(2, n_tok, 24, gen, dtype=dtype)
    want = qwen3_5.causal_conv1d_fn(x.transpose(1, 2), w, None, activation="silu")
    out, new_state = cc.causal_conv1d_reference(x, w)
    torch.testing.assert_close(out, want.transpose(1, 2), rtol=0, atol=0)
    # the cache's prefill state: the last K inputs, zero-padded on the left
    padded = torch.nn.functional.pad(x.transpose(1, 2), (max(0, 4 - n_tok), 0))
    torch.testing.assert_close(new_state, padded[..., -4:], rtol=0, atol=0)
    # decode: transformers' update shifts the cached state in place
    cache = state.clone()
    want = qwen3_5.causal_conv1d_update(x.transpose(1, 2), cache, w, None, "silu")
    out, new_state = cc.causal_conv1d_reference(x, w, state=state)
    torch.testing.assert_close(out, want.transpose(1, 2), rtol=0, atol=0)
    torch.testing.assert_close(new_state, cache, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_norm_reference_matches_transformers(dtype, gen):
    mod = qwen3_5.Qwen3_5RMSNormGated(128, eps=1e-6).to(dtype)
    with torch.no_grad():
        mod.weight.copy_(torch.randn(128, generator=gen))
    x = torch.randn(37, 128, generator=gen).to(dtype)
    z = torch.randn(37, 128, generator=gen).to(dtype)
    want = mod(x, z)
    torch.testing.assert_close(
        rg.rms_norm_gated_reference(x, z, mod.weight, 1e-6), want, rtol=0, atol=0
    )


# ---------------------------------------------------------------------------------------------
# CPU: AOT signatures cover the launches
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def launches(monkeypatch):
    seen = []

    def record(stream, grid, kernel, args):
        seen.append((kernel, grid, args))

    monkeypatch.setattr(ct, "launch", record)
    for mod in (cc, rg):
        monkeypatch.setattr(mod, "stream", lambda *a: None)
        monkeypatch.setattr(mod, "check_activation", lambda *a: None)
    return seen


def test_aot_signatures_cover_the_launches(launches, gen):
    sigs = {
        **cc.aot_signatures(dtypes=(torch.bfloat16,)),
        **rg.aot_signatures(dtypes=(torch.bfloat16,)),
    }
    for ch in (6144, 8192):
        x, w, state = _conv_inputs(2, 9, ch, gen, dtype=torch.bfloat16)
        cc.causal_conv1d(x, w, state_out=state)
        cc.causal_conv1d_update(x[:, :1], state, w)
    for tokens in (3, rg.FEW_ROWS // 16):  # decode's few rows and prefill's many
        x = torch.zeros(2, tokens, 16, 128, dtype=torch.bfloat16)
        rg.rms_norm_gated(x, x, torch.ones(128, dtype=torch.bfloat16), 1e-6)
    assert {args[5] for k, _, args in launches if k is rg.rms_norm_gated_kernel} == {4, 16}
    assert {k for k, _, _ in launches} == set(sigs)
    for kernel, _, args in launches:
        assert any(launch_fits(s, args) for s in sigs[kernel]), (kernel._pyfunc.__name__, args)


@pytest.mark.slow
def test_aot_signatures_compile_for_sm90():
    from tilegym.kernel_inventory.compile import compile_kernel, toolchain_problem

    if toolchain_problem():
        pytest.skip(toolchain_problem())
    for mod in (cc, rg):
        for kernel, ss in mod.aot_signatures().items():
            assert compile_kernel(kernel, ss, "sm_90") is None, kernel._pyfunc.__name__


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 1, 6144), (2, 3, 6144), (2, 17, 8192), (3, 130, 1000)])
@pytest.mark.parametrize("with_state", [False, True])
def test_conv_prefill_matches_reference(shape, dtype, with_state, gen, poison_empty):
    bsz, n_tok, ch = shape
    x, w, state = _conv_inputs(bsz, n_tok, ch, gen, "cuda", dtype)
    state_out = torch.empty_like(state)
    out = cc.causal_conv1d(x, w, state_in=state if with_state else None, state_out=state_out)
    want, want_state = cc.causal_conv1d_reference(
        x.float(), w.float(), state=state.float() if with_state else None
    )
    assert_close_rel(out, want)
    assert torch.equal(state_out.float(), want_state)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n_tok", [1, 2, 5])
def test_conv_update_shifts_the_state_in_place(n_tok, dtype, gen, poison_empty):
    x, w, state = _conv_inputs(4, n_tok, 6144, gen, "cuda", dtype)
    want, want_state = cc.causal_conv1d_reference(x.float(), w.float(), state=state.float())
    out = cc.causal_conv1d_update(x, state, w)
    assert_close_rel(out, want)
    assert torch.equal(state.float(), want_state)


@pytest.mark.gpu
def test_conv_prefill_then_decode_equals_one_pass(gen):
    """Prefill writes the state the decode steps continue from, in place, 20 steps."""
    x, w, _ = _conv_inputs(2, 40, 6144, gen, "cuda", torch.bfloat16)
    state = torch.full((2, 6144, 4), float("nan"), device="cuda", dtype=torch.bfloat16)
    outs = [cc.causal_conv1d(x[:, :20], w, state_out=state)]
    outs += [cc.causal_conv1d_update(x[:, t : t + 1], state, w) for t in range(20, 40)]
    assert torch.equal(torch.cat(outs, dim=1), cc.causal_conv1d(x, w))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 7, 64, 1000, 2051])
def test_gated_norm_matches_reference(rows, dtype, gen, poison_empty):
    x = torch.randn(rows, 128, device="cuda", generator=gen).to(dtype)
    z = torch.randn(rows, 128, device="cuda", generator=gen).to(dtype) * 3
    w = torch.randn(128, device="cuda", generator=gen).to(dtype)
    out = rg.rms_norm_gated(x, z, w, 1e-6)
    assert_close_rel(out, rg.rms_norm_gated_reference(x.float(), z.float(), w.float(), 1e-6))
    # and the module's own roundings, to within one rounding
    assert_close_rel(out, rg.rms_norm_gated_reference(x, z, w, 1e-6), 4e-3)


# ---------------------------------------------------------------------------------------------
# CPU: the custom ops (torch.library) the compiled model glue calls
# ---------------------------------------------------------------------------------------------


def test_library_ops_pass_opcheck_on_cpu(gen):
    from tests.ops.test_gated_delta import _inputs

    q, k, v, a, b, A_log, dt_bias = _inputs(2, 70, 2, 4, 16, 16, gen)
    s0 = torch.randn(2, 4, 16, 16, generator=gen)
    ops = torch.ops.tilegym
    import tilegym.ops.library  # noqa: F401  (registers the ops)

    torch.library.opcheck(ops.gated_delta_chunk.default, (q, k, v, a, b, A_log, dt_bias, None))
    torch.library.opcheck(ops.gated_delta_chunk.default, (q, k, v, a, b, A_log, dt_bias, s0))
    step = tuple(t[:, :1] for t in (q, k, v, a, b))
    torch.library.opcheck(ops.gated_delta_recurrent.default, (*step, A_log, dt_bias, s0.clone()))
    x, w, state = _conv_inputs(2, 9, 24, gen)
    torch.library.opcheck(ops.causal_conv1d.default, (x, w, None, None, 4))
    torch.library.opcheck(ops.causal_conv1d.default, (x, w, None, state, 4))
    torch.library.opcheck(ops.causal_conv1d_update.default, (x[:, :1], state.clone(), w, None))
    z = torch.randn(9, 16, generator=gen)
    torch.library.opcheck(ops.rms_norm_gated.default, (z, z * 2, torch.ones(16), 1e-6))


def test_library_functions_on_cpu_follow_the_references(gen):
    from tests.ops.test_gated_delta import _inputs
    from tilegym.ops import gated_delta as gd
    from tilegym.ops import library as lib

    q, k, v, a, b, A_log, dt_bias = _inputs(1, 66, 2, 2, 16, 16, gen)
    g, beta = gd.gates_reference(a, b, A_log, dt_bias)
    out, state = lib.gated_delta_chunk(
        q[:, :65], k[:, :65], v[:, :65], a[:, :65], b[:, :65], A_log, dt_bias
    )
    last = tuple(t[:, 65:] for t in (q, k, v, a, b))
    out2 = lib.gated_delta_recurrent(*last, A_log, dt_bias, state)
    want, want_state = gd.recurrent_reference(q, k, v, g, beta)
    torch.testing.assert_close(torch.cat([out, out2], 1), want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(state, want_state, rtol=1e-4, atol=1e-5)
    x, w, _ = _conv_inputs(2, 12, 24, gen)
    out, cstate = lib.causal_conv1d(x[:, :7], w)
    outs = [out] + [lib.causal_conv1d_update(x[:, t : t + 1], cstate, w) for t in range(7, 12)]
    torch.testing.assert_close(torch.cat(outs, 1), cc.causal_conv1d_reference(x, w)[0])
