"""Elementwise residual add: the ``residual + hidden_states`` of a decoder layer."""

from __future__ import annotations

import cuda.tile as ct
import torch

from tilegym.ops._common import AOT_DTYPES, PAD_ZERO, array_sig, check_activation, signature, stream

TILE = 2048


@ct.kernel
def add_kernel(a, b, out, TILE_N: ct.Constant[int]):
    """out = a + b over flat arrays, rounded once to out's dtype."""
    i = ct.bid(0)
    x = ct.load(a, (i,), (TILE_N,), padding_mode=PAD_ZERO).astype(ct.float32)
    y = ct.load(b, (i,), (TILE_N,), padding_mode=PAD_ZERO).astype(ct.float32)
    ct.store(out, (i,), (x + y).astype(out.dtype))


def add(a: torch.Tensor, b: torch.Tensor, tile: int = TILE) -> torch.Tensor:
    """``a + b`` for same-shape, same-dtype tensors (the decoder layer's residual adds)."""
    check_activation("a", a)
    check_activation("b", b)
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"add needs matching shapes/dtypes: {tuple(a.shape)} vs {tuple(b.shape)}")
    a1, b1 = a.contiguous().view(-1), b.contiguous().view(-1)
    out = torch.empty_like(a1)
    n = a1.numel()
    if n:
        ct.launch(stream(), ((n + tile - 1) // tile, 1, 1), add_kernel, (a1, b1, out, tile))
    return out.view(a.shape)


def add_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The PyTorch op the kernel replaces."""
    return a + b


def aot_signatures(dtypes=AOT_DTYPES) -> dict:
    """Signatures for the AOT gate."""
    return {add_kernel: [signature(*(array_sig(dt, 1),) * 3, TILE) for dt in dtypes]}
