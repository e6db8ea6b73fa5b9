"""Embedding lookup (``nn.Embedding.forward`` without max_norm): one row gather per token."""

from __future__ import annotations

import cuda.tile as ct
import torch
from cuda.tile.compilation import ArrayConstraint

from tilegym.ops._common import (
    AOT_DTYPES,
    PAD_ZERO,
    array_sig,
    check_activation,
    next_pow2,
    signature,
    stream,
)


@ct.kernel
def embedding_kernel(ids, weight, out, TILE_N: ct.Constant[int]):
    """out[t, cols] = weight[ids[t], cols] for one token and one column tile per block."""
    t = ct.bid(0)
    j = ct.bid(1)
    row = ct.load(ids, (t,), (1,)).reshape(())
    vals = ct.load(weight, (row, j), (1, TILE_N), padding_mode=PAD_ZERO)
    ct.store(out, (t, j), vals)


def tile_n(n: int) -> int:
    """Column tile: up to 2048 elements."""
    return min(2048, next_pow2(n))


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``weight[ids]`` for integer ids of any shape; ids must lie in ``[0, vocab)``."""
    check_activation("weight", weight)
    if ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"ids dtype {ids.dtype} must be int32 or int64")
    flat = ids.reshape(-1).contiguous()
    n = weight.shape[1]
    w = weight if weight.stride(-1) == 1 else weight.contiguous()
    out = torch.empty((flat.numel(), n), dtype=weight.dtype, device=weight.device)
    if flat.numel():
        tn = tile_n(n)
        grid = (flat.numel(), (n + tn - 1) // tn, 1)
        ct.launch(stream(), grid, embedding_kernel, (flat, w, out, tn))
    return out.view(*ids.shape, n)


def embedding_reference(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The PyTorch op the kernel replaces."""
    return torch.nn.functional.embedding(ids, weight)


def aot_signatures(hidden_sizes=(1024, 2048), dtypes=AOT_DTYPES) -> dict:
    """Signatures for the AOT gate (hidden sizes of Qwen3-0.6B and Llama-3.2-1B)."""
    ids = ArrayConstraint(
        ct.int64,
        1,
        index_dtype=ct.int32,
        stride_lower_bound_incl=0,
        alias_groups=(),
        may_alias_internally=False,
        stride_constant=(1,),
    )
    sigs = [
        signature(ids, array_sig(dt, 2), array_sig(dt, 2), tile_n(n))
        for dt in dtypes
        for n in hidden_sizes
    ]
    return {embedding_kernel: sigs}
