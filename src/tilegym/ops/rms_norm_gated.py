"""Gated RMSNorm of Qwen3.5 / Qwen3-Next linear attention: ``norm(x) * w * silu(z)``.

``Qwen3_5RMSNormGated.forward``: the row normalised in fp32, rounded to x's dtype, times the
weight (a product rounded to the promoted dtype, as PyTorch's), times ``silu(z)`` in fp32,
rounded once more to x's dtype. The kernel keeps those roundings. Rows are the heads of the
attention output (``[tokens * heads, head_dim]``), whole rows per tile.

Loads and stores are plain (no TMA) and a block takes few rows (``tile_sizes``). Measured on an
H100 at head_dim 128 (50 calls back to back in a CUDA graph,
``benchmarks/ops/bench_rms_norm_gated.py``): the decode step's 16 rows took 11.3 us as one
64-row TMA tile and 2.1 us as four-row plain tiles; 32768 prefill rows 21.0 us as 64-row TMA
tiles, 10.6 us as 16-row plain ones (TMA at 16 rows: 28.0 us).
"""

from __future__ import annotations

import cuda.tile as ct
import torch
import torch.nn.functional as F
from cuda.tile.compilation import ScalarConstraint

from tilegym.ops._common import (
    AOT_DTYPES,
    PAD_ZERO,
    array_sig,
    check_activation,
    next_pow2,
    signature,
    stream,
)

#: elements of a block's tile (whole rows) when there are many rows, and the rows of a block
#: when there are fewer than ``FEW_ROWS`` (decode: one block per few heads, all SMs busy sooner)
TILE_ELEMS = 2048
FEW_ROW_TILE = 4
FEW_ROWS = 2048


@ct.kernel
def rms_norm_gated_kernel(
    x,
    z,
    w,
    out,
    eps,
    TILE_M: ct.Constant[int],
    TILE_N: ct.Constant[int],
    ROUND_PRODUCT: ct.Constant[bool],
    TMA: ct.Constant[bool],
):
    """out = cast(w * cast(x * rsqrt(mean(x^2) + eps)) * silu(z)) for TILE_M rows (TMA: loads
    and store through the tensor-memory accelerator; the benchmark's earlier form)."""
    bid = ct.bid(0)
    n = x.shape[1]
    xf = _load(x, (bid, 0), (TILE_M, TILE_N), TMA).astype(ct.float32)
    zf = _load(z, (bid, 0), (TILE_M, TILE_N), TMA).astype(ct.float32)
    wf = _load(w, (0,), (TILE_N,), TMA).astype(ct.float32)
    inv = ct.rsqrt(ct.sum(xf * xf, axis=1, keepdims=True) / n + eps)
    normed = (xf * inv).astype(x.dtype).astype(ct.float32)
    h = wf.reshape((1, TILE_N)) * normed
    if ROUND_PRODUCT:
        h = h.astype(x.dtype).astype(ct.float32)
    gate = zf / (1.0 + ct.exp(-zf))
    ct.store(out, (bid, 0), (h * gate).astype(out.dtype), allow_tma=TMA)


@ct.function
def _load(a, index, shape, TMA: ct.Constant[bool]):
    """A zero-padded tile, through plain loads unless TMA."""
    return ct.load(a, index, shape, padding_mode=PAD_ZERO, allow_tma=TMA)


def tile_sizes(n: int, rows: int = FEW_ROWS) -> tuple[int, int]:
    """(TILE_M, TILE_N) for ``rows`` rows of length ``n``: whole rows; ``FEW_ROW_TILE`` rows a
    block below ``FEW_ROWS`` rows, else about ``TILE_ELEMS`` elements a block."""
    tile_n = next_pow2(n)
    most = FEW_ROW_TILE if rows < FEW_ROWS else 16
    return max(1, min(most, TILE_ELEMS // tile_n)), tile_n


def rms_norm_gated(
    x: torch.Tensor,
    z: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    tile_rows: int | None = None,
    tma: bool = False,
):
    """Gated RMSNorm over the last dim of x (any leading shape); z has x's shape.
    ``tile_rows`` (rows a block, a power of two) and ``tma`` override the tiles for benchmarks."""
    check_activation("x", x)
    check_activation("z", z)
    n = x.shape[-1]
    if z.shape != x.shape:
        raise ValueError(f"z {tuple(z.shape)} must match x {tuple(x.shape)}")
    if weight.shape != (n,):
        raise ValueError(f"weight {tuple(weight.shape)} must be ({n},)")
    if n > 8192:
        raise ValueError(f"row length {n} over 8192")
    x2, z2 = (t.reshape(-1, n) for t in (x, z))
    x2, z2 = (t if t.stride(-1) == 1 else t.contiguous() for t in (x2, z2))
    m = x2.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m:
        tm, tn = tile_sizes(n, m)
        tm = tile_rows or tm
        rnd = torch.promote_types(x.dtype, weight.dtype) == x.dtype and x.dtype != torch.float32
        args = (x2, z2, weight.contiguous(), out, float(eps), tm, tn, bool(rnd), tma)
        ct.launch(stream(), ((m + tm - 1) // tm, 1, 1), rms_norm_gated_kernel, args)
    return out.view(x.shape)


def rms_norm_gated_reference(x, z, weight, eps):
    """``Qwen3_5RMSNormGated.forward`` in PyTorch."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    h = weight * h.to(dtype)
    return (h * F.silu(z.float())).to(dtype)


def aot_signatures(row_sizes=(128,), dtypes=AOT_DTYPES) -> dict:
    """Signatures for head dims of the linear attention (128 in every Qwen3.5), at the tiles
    of few rows (decode) and of many (prefill)."""
    sigs = []
    for dt in dtypes:
        a2, a1 = array_sig(dt, 2), array_sig(dt, 1)
        for n in row_sizes:
            for tiles in sorted({tile_sizes(n, 1), tile_sizes(n, FEW_ROWS)}):
                sigs.append(
                    signature(a2, a2, a1, a2, ScalarConstraint(ct.float32), *tiles, True, False)
                )
    return {rms_norm_gated_kernel: sigs}
