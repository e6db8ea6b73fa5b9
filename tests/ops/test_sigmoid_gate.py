"""Qwen3.5 / Qwen3-Next's sigmoid gates on cuTile (``tilegym.ops.sigmoid_gate``).

CPU: the references are upstream's ops (the attention output gate on the q projection's gate
halves, the shared expert's gate and sum); the custom ops' CPU kernels and fakes pass opcheck;
bad inputs get one clear error; every launch fits a declared AOT signature; the signatures
compile for sm_90, sm_100 and sm_120 (slow).
GPU: both kernels against fp32 references on fresh random inputs (one token, odd token counts,
a prompt, odd widths), the gate read in place from a strided view, NaN-poisoned outputs.
"""

from __future__ import annotations

import pytest
import torch

from tilegym.ops import sigmoid_gate as sg
from tilegym.ops.testing import assert_close_rel, launch_fits


def _q_with_gates(t, heads, d, dtype, device="cpu", generator=None):
    """A q projection laid out as upstream's [q; gate] per head, and its gate-half view."""
    q = torch.randn(t, heads, 2 * d, device=device, generator=generator).to(dtype) * 2
    return q, q[..., d:]


def test_gate_reference_is_the_attention_forwards_product():
    """``Qwen3NextAttention``: ``query_states, gate = torch.chunk(q.view(..., -1, 2 D), 2, -1)``,
    ``gate = gate.reshape(*input_shape, -1)``, ``attn_output * torch.sigmoid(gate)``."""
    q, gate = _q_with_gates(5, 4, 16, torch.bfloat16)
    attn = torch.randn(5, 64).to(torch.bfloat16)
    _, upstream_gate = torch.chunk(q, 2, dim=-1)
    want = attn * torch.sigmoid(upstream_gate.reshape(5, -1))
    assert torch.equal(sg.sigmoid_gate_reference(attn, gate), want)


def test_gate_add_reference_is_the_shared_experts_gate_then_the_sum():
    res, x = torch.randn(3, 32).to(torch.bfloat16), torch.randn(3, 32).to(torch.bfloat16)
    g = torch.randn(3, 1).to(torch.bfloat16)
    shared = torch.nn.functional.sigmoid(g) * x  # Qwen3NextSparseMoeBlock
    assert torch.equal(sg.sigmoid_gate_add_reference(res, x, g), res + shared)


def test_cpu_ops_are_the_references_and_pass_opcheck():
    from tilegym.ops import library

    q, gate = _q_with_gates(3, 2, 8, torch.float32)
    attn = torch.randn(3, 16)
    assert torch.equal(library.sigmoid_gate(attn, gate), sg.sigmoid_gate_reference(attn, gate))
    torch.library.opcheck(library.sigmoid_gate_op, (attn, gate))
    res, x, g = torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 1)
    got = library.sigmoid_gate_add(res, x, g)
    assert torch.equal(got, sg.sigmoid_gate_add_reference(res, x, g))
    torch.library.opcheck(library.sigmoid_gate_add_op, (res, x, g))


@pytest.mark.parametrize(
    ("x", "gate", "words"),
    [
        (torch.zeros(3, 16), torch.zeros(3, 16), r"must be \[\.\.\., H, D\]"),
        (torch.zeros(3, 16), torch.zeros(4, 2, 8), r"must be \[\.\.\., H, D\]"),
        (torch.zeros(3, 18), torch.zeros(3, 2, 8), r"must be \[\.\.\., 16\]"),
        (torch.zeros(3, 16), torch.zeros(3, 2, 8).half(), r"must be \[\.\.\., 16\]"),
        (torch.zeros(3, 16), torch.zeros(3, 8, 2).transpose(1, 2), "unit last stride"),
        (torch.zeros(3, 16), torch.zeros(3, 2, 8), "CUDA"),
    ],
)
def test_bad_gate_inputs_get_one_clear_error(x, gate, words):
    with pytest.raises(ValueError, match=words):
        sg.sigmoid_gate(x, gate)


@pytest.mark.parametrize(
    ("res", "x", "gate", "words"),
    [
        (torch.zeros(3, 8), torch.zeros(3, 9), torch.zeros(3, 1), "must be"),
        (torch.zeros(3, 8), torch.zeros(3, 8), torch.zeros(3, 2), "must be"),
        (torch.zeros(3, 8), torch.zeros(3, 8), torch.zeros(3, 1).half(), "dtypes differ"),
        (torch.zeros(3, 8), torch.zeros(3, 8), torch.zeros(3, 1), "CUDA"),
    ],
)
def test_bad_gate_add_inputs_get_one_clear_error(res, x, gate, words):
    with pytest.raises(ValueError, match=words):
        sg.sigmoid_gate_add(res, x, gate)


@pytest.mark.parametrize("n", [1, 7, 2048])
def test_every_launch_fits_a_declared_signature(n):
    """The wrappers' launch arguments, built as they build them (no GPU: the tensors are the
    CPU twins of what they launch with)."""
    sigs = sg.aot_signatures()
    for dtype in (torch.bfloat16, torch.float16):
        tm, tn = sg.tile_sizes(256)
        x3 = torch.empty(n, 16, 256, dtype=dtype)
        _, g3 = _q_with_gates(n, 16, 256, dtype)
        args = (x3, g3, x3, tm, tn)
        assert any(launch_fits(s, args) for s in sigs[sg.sigmoid_gate_kernel])
        tm, tn = sg.tile_sizes(2048)
        a2, g2 = torch.empty(n, 2048, dtype=dtype), torch.empty(n, 1, dtype=dtype)
        args = (a2, a2, g2, a2, tm, tn)
        assert any(launch_fits(s, args) for s in sigs[sg.sigmoid_gate_add_kernel])


@pytest.mark.slow
def test_signatures_compile_for_every_target():
    from tilegym.kernel_inventory.compile import compile_kernel, toolchain_problem

    if toolchain_problem():
        pytest.skip(toolchain_problem())
    for kernel, sigs in sg.aot_signatures().items():
        for gpu in ("sm_90", "sm_100", "sm_120"):
            assert compile_kernel(kernel, sigs, gpu) is None, (kernel.__name__, gpu)


# ------------------------------------------------------------------------------------------ GPU

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("t", "heads", "d"), [(1, 16, 256), (37, 16, 256), (2048, 8, 256), (5, 3, 80)]
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gate_matches_fp32(t, heads, d, dtype, gen, poison_empty):
    q, gate = _q_with_gates(t, heads, d, dtype, "cuda", gen)
    attn = torch.randn(t, heads * d, device="cuda", generator=gen).to(dtype)
    out = sg.sigmoid_gate(attn, gate)
    assert out.shape == attn.shape and out.dtype == dtype
    assert_close_rel(out, sg.sigmoid_gate_reference(attn.float(), gate.float()))
    # eager PyTorch on the same dtype rounds the same way: equal up to exp's last bits
    eager = sg.sigmoid_gate_reference(attn, gate)
    assert (out.float() - eager.float()).abs().max().item() <= 2 * eager.float().abs().max() * 2**-8


@pytest.mark.gpu
@pytest.mark.parametrize(("t", "n"), [(1, 2048), (3, 2048), (37, 1000), (2048, 2048), (8, 5)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gate_add_matches_fp32(t, n, dtype, gen, poison_empty):
    res = torch.randn(t, n, device="cuda", generator=gen).to(dtype)
    x = torch.randn(t, n, device="cuda", generator=gen).to(dtype)
    g = (torch.randn(t, 1, device="cuda", generator=gen) * 4).to(dtype)
    out = sg.sigmoid_gate_add(res, x, g)
    assert out.shape == x.shape and out.dtype == dtype
    assert_close_rel(out, sg.sigmoid_gate_add_reference(res.float(), x.float(), g.float()))


@pytest.mark.gpu
def test_gate_add_fails_a_wrong_answer(gen):
    res = torch.randn(4, 64, device="cuda", generator=gen)
    ref = sg.sigmoid_gate_add_reference(res, res, res[:, :1])
    with pytest.raises(AssertionError):
        assert_close_rel(res.to(torch.bfloat16), ref)
