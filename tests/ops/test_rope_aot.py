"""CPU checks of the RoPE module's AOT signatures: every launch the default dispatch makes for
the Qwen3-0.6B and Llama-3.2-1B head layouts (decode and prefill token counts, bf16 and fp16)
has a signature with the same kernel, array ranks and compile-time constants."""

import cuda.tile as ct
import pytest
import torch
from cuda.tile.compilation import ArrayConstraint, ScalarConstraint

from tilegym.ops import rope as rp

LAYOUTS = [(16, 8, 128), (32, 8, 64)]
SHAPES = [(1, 1), (8, 1), (1, 31), (1, 33), (2, 37), (1, 2048), (4, 4096)]


def _key(kernel, params):
    """(kernel, array ranks, constants) of a launch's arguments or a signature's parameters."""
    ranks, consts = [], []
    for p in params:
        if isinstance(p, ArrayConstraint):
            ranks.append(p.ndim)
        elif isinstance(p, torch.Tensor):
            ranks.append(p.dim())
        elif not isinstance(p, ScalarConstraint | float | int) or isinstance(p, bool):
            consts.append(getattr(p, "value", p))
    return kernel, tuple(ranks), tuple(consts)


@pytest.fixture
def launches(monkeypatch):
    """Record (kernel, args) of every ct.launch instead of launching (CPU tensors)."""
    seen = []
    monkeypatch.setattr(
        ct, "launch", lambda stream, grid, kernel, args: seen.append((kernel, args))
    )
    monkeypatch.setattr(rp, "stream", lambda *a: None)
    monkeypatch.setattr(rp, "check_activation", lambda *a: None)
    return seen


def _sig_keys(sigs):
    return {_key(k, s.parameters) for k, ss in sigs.items() for s in ss}


def _launch_key(kernel, args, const_from):
    """Constants of a launch: the trailing ``const_from`` arguments (ints/bools after eps etc.)."""
    ranks = tuple(a.dim() for a in args if isinstance(a, torch.Tensor))
    return kernel, ranks, tuple(args[const_from:])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rope_aot_covers_default_launches(dtype, launches):
    keys = _sig_keys(rp.aot_signatures(heads=LAYOUTS, dtypes=(dtype,), partial_rot=()))
    for hq, hk, d in LAYOUTS:
        for b, s in SHAPES:
            qkv = torch.randn(b, s, (hq + 2 * hk) * d).to(dtype)
            q = qkv[..., : hq * d].view(b, s, hq, d)
            k = qkv[..., hq * d : (hq + hk) * d].view(b, s, hk, d)
            cos = sin = torch.randn(1, s, d).to(dtype)
            w = torch.randn(d).to(dtype)
            rp.apply_rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            rp.qk_norm_rope(q, k, w, w, 1e-6, cos, sin)
    assert launches
    for kernel, args in launches:
        nconst = {rp.rope_kernel: 4, rp.qk_norm_rope_kernel: 4}.get(kernel, 5)
        key = _launch_key(kernel, args, len(args) - nconst)
        assert key in keys, f"no AOT signature for {key}"


def test_aot_signatures_name_the_default_kernels():
    sigs = rp.aot_signatures()
    assert set(sigs) == set(rp.default_rope_kernels()) | set(rp.default_qk_kernels())
    assert all(sigs.values())


def test_auto_decode_takes_the_loop_kernel_for_halves_that_are_not_power_of_two_tiles(launches):
    """Phi-3.5-mini's heads (32 of 96: halves of 48) decode with the head-loop kernel, which the
    AOT signatures cover; power-of-two halves (Llama's 64) keep the per-token kernel."""
    keys = _sig_keys(rp.aot_signatures(heads=[(32, 32, 96), (32, 8, 64)], partial_rot=()))
    for hq, hk, d in [(32, 32, 96), (32, 8, 64)]:
        for b in (1, 8):
            q = torch.randn(b, hq, 1, d).to(torch.bfloat16)
            k = torch.randn(b, hk, 1, d).to(torch.bfloat16)
            cos = sin = torch.randn(1, 1, d).to(torch.bfloat16)
            rp.apply_rope(q, k, cos, sin)
    kernels = [kernel for kernel, _ in launches]
    assert kernels == [rp.rope_loop_kernel] * 2 + [rp.rope_kernel] * 2
    for kernel, args in launches:
        key = _launch_key(kernel, args, len(args) - (4 if kernel is rp.rope_kernel else 5))
        assert key in keys, f"no AOT signature for {key}"
