"""RMSNorm and fused residual-add + RMSNorm with transformers' numerics.

transformers (e.g. ``Qwen3RMSNorm.forward``, ``LlamaRMSNorm.forward``) upcasts to fp32, takes
the mean of squares, multiplies by ``rsqrt(var + eps)``, casts back to the input dtype and only
then multiplies by the weight (a product rounded to the promoted dtype). The kernels keep every
one of those roundings so the outputs match the PyTorch module, not just an fp32 ideal.
"""

from __future__ import annotations

import cuda.tile as ct
import torch
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

MAX_HIDDEN = 8192


@ct.kernel
def rms_norm_kernel(x, w, out, eps, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int]):
    """out[r] = w * cast(x[r] * rsqrt(mean(x[r]^2) + eps)) for TILE_M rows per block."""
    bid = ct.bid(0)
    n = x.shape[1]
    xt = ct.load(x, (bid, 0), (TILE_M, TILE_N), padding_mode=PAD_ZERO, latency=10)
    xf = xt.astype(ct.float32)
    inv = ct.rsqrt(ct.sum(xf * xf, axis=1, keepdims=True) / n + eps)
    normed = (xf * inv).astype(x.dtype).astype(ct.float32)
    wt = ct.load(w, (0,), (TILE_N,), padding_mode=PAD_ZERO).astype(ct.float32)
    y = normed * wt.reshape((1, TILE_N))
    ct.store(out, (bid, 0), y.astype(out.dtype), allow_tma=False)


@ct.kernel
def add_rms_norm_kernel(
    x, residual, w, sum_out, out, eps, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int]
):
    """sum_out = x + residual (rounded like PyTorch), out = RMSNorm(sum_out)."""
    bid = ct.bid(0)
    n = x.shape[1]
    xt = ct.load(x, (bid, 0), (TILE_M, TILE_N), padding_mode=PAD_ZERO, latency=10)
    rt = ct.load(residual, (bid, 0), (TILE_M, TILE_N), padding_mode=PAD_ZERO, latency=10)
    s = (xt.astype(ct.float32) + rt.astype(ct.float32)).astype(sum_out.dtype)
    ct.store(sum_out, (bid, 0), s, allow_tma=False)
    sf = s.astype(ct.float32)
    inv = ct.rsqrt(ct.sum(sf * sf, axis=1, keepdims=True) / n + eps)
    normed = (sf * inv).astype(sum_out.dtype).astype(ct.float32)
    wt = ct.load(w, (0,), (TILE_N,), padding_mode=PAD_ZERO).astype(ct.float32)
    y = normed * wt.reshape((1, TILE_N))
    ct.store(out, (bid, 0), y.astype(out.dtype), allow_tma=False)


#: Elements per block (whole rows); measured on the H200 in benchmarks/ops/bench_rms_norm.py.
TILE_ELEMS = 8192


def tile_sizes(n: int, tile_elems: int = TILE_ELEMS) -> tuple[int, int]:
    """(TILE_M, TILE_N): whole rows per tile, about ``tile_elems`` elements per block.

    TILE_M does not depend on the row count, so one compiled kernel per hidden size serves
    decode and prefill alike (rows past the end are masked, not loaded).
    """
    tile_n = next_pow2(n)
    return max(1, min(32, tile_elems // tile_n)), tile_n


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    check_activation("x", x)
    check_activation("weight", weight)
    n = x.shape[-1]
    if weight.shape != (n,):
        raise ValueError(f"weight shape {tuple(weight.shape)} does not match hidden size {n}")
    if not 1 <= n <= MAX_HIDDEN:
        raise ValueError(f"hidden size {n} outside the supported 1..{MAX_HIDDEN}")


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    tile_elems: int = TILE_ELEMS,
) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` (any leading shape), as transformers computes it."""
    _check(x, weight)
    x2 = _rows(x)
    m, n = x2.shape
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    if m:
        tm, tn = tile_sizes(n, tile_elems)
        grid = ((m + tm - 1) // tm, 1, 1)
        args = (x2, weight.contiguous(), out, float(eps), tm, tn)
        ct.launch(stream(), grid, rms_norm_kernel, args)
    return out.view(*x.shape[:-1], n)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    tile_elems: int = TILE_ELEMS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual + x, RMSNorm(residual + x)) in one pass; the sum is rounded to x's dtype first."""
    _check(x, weight)
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(
            f"residual {tuple(residual.shape)}/{residual.dtype} must match x "
            f"{tuple(x.shape)}/{x.dtype}"
        )
    x2, r2 = _rows(x), _rows(residual)
    m, n = x2.shape
    total = torch.empty((m, n), dtype=x.dtype, device=x.device)
    out = torch.empty((m, n), dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if m:
        tm, tn = tile_sizes(n, tile_elems)
        grid = ((m + tm - 1) // tm, 1, 1)
        args = (x2, r2, weight.contiguous(), total, out, float(eps), tm, tn)
        ct.launch(stream(), grid, add_rms_norm_kernel, args)
    shape = (*x.shape[:-1], n)
    return total.view(shape), out.view(shape)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm forward, verbatim in PyTorch."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


def add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoder layer's ``residual + hidden_states`` followed by its RMSNorm."""
    total = residual + x
    return total, rms_norm_reference(total, weight, eps)


def aot_signatures(hidden_sizes=(64, 128, 1024, 2048, 4096, 8192), dtypes=AOT_DTYPES) -> dict:
    """Signatures for the AOT gate: every (dtype, hidden size) the models launch."""
    plain, fused = [], []
    for dt in dtypes:
        for n in hidden_sizes:
            tm, tn = tile_sizes(n)
            a2, a1, eps = array_sig(dt, 2), array_sig(dt, 1), ScalarConstraint(ct.float32)
            plain.append(signature(a2, a1, a2, eps, tm, tn))
            fused.append(signature(a2, a2, a1, a2, a2, eps, tm, tn))
    return {rms_norm_kernel: plain, add_rms_norm_kernel: fused}
