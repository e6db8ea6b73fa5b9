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
    DEFAULT,
    PAD_ZERO,
    array_sig,
    check_activation,
    next_pow2,
    signature,
    sm_count,
    stream,
    with_occupancy,
)

MAX_HIDDEN = 8192

#: Resident CTAs per SM the compiler is told to allow (``ct.kernel(occupancy=...)``), which caps
#: registers per thread. Without the hint tileiras gives these kernels 255 registers x 256
#: threads: one CTA per SM, so each SM has a single tile load in flight and waits for it before
#: computing and storing (1.7 TB/s at 8192x4096). With 4 (64 registers, no spills; the tile is
#: re-read from the TMA buffer in shared memory) four tiles per SM overlap. ``None`` restores
#: the compiler's choice. Swept on the H200 by benchmarks/ops/bench_rms_norm.py.
OCCUPANCY = 4
#: The same for add+RMSNorm (two input tiles per block: 2 x 16 KB in flight at 8192x4096).
ADD_OCCUPANCY = 2
#: Persistent grid (one CTA per SM x occupancy, looping over row tiles, weight loaded once)
#: instead of one CTA per row tile.
PERSISTENT = False


@ct.kernel(occupancy=OCCUPANCY)
def rms_norm_kernel(x, w, out, eps, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int]):
    """out[r] = w * cast(x[r] * rsqrt(mean(x[r]^2) + eps)) for TILE_M rows per block."""
    bid = ct.bid(0)
    n = x.shape[1]
    xt = ct.load(x, (bid, 0), (TILE_M, TILE_N), padding_mode=PAD_ZERO, latency=10)
    wt = ct.load(w, (0,), (TILE_N,), padding_mode=PAD_ZERO).astype(ct.float32)
    ct.store(out, (bid, 0), _normed(xt, wt, n, eps, x.dtype, out.dtype), allow_tma=False)


@ct.function
def _normed(xt, wt, n, eps, in_dtype, out_dtype):
    """transformers' RMSNorm of the rows of one tile (fp32 math, the module's roundings)."""
    xf = xt.astype(ct.float32)
    inv = ct.rsqrt(ct.sum(xf * xf, axis=1, keepdims=True) / n + eps)
    normed = (xf * inv).astype(in_dtype).astype(ct.float32)
    return (normed * wt.reshape((1, wt.shape[0]))).astype(out_dtype)


@ct.kernel(occupancy=OCCUPANCY)
def rms_norm_persistent_kernel(x, w, out, eps, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int]):
    """``rms_norm_kernel`` on a persistent grid: each block loops over row tiles."""
    n = x.shape[1]
    wt = ct.load(w, (0,), (TILE_N,), padding_mode=PAD_ZERO).astype(ct.float32)
    for t in range(ct.bid(0), ct.cdiv(x.shape[0], TILE_M), ct.num_blocks(0)):
        xt = ct.load(x, (t, 0), (TILE_M, TILE_N), padding_mode=PAD_ZERO, latency=10)
        ct.store(out, (t, 0), _normed(xt, wt, n, eps, x.dtype, out.dtype), allow_tma=False)


@ct.kernel(occupancy=ADD_OCCUPANCY)
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
    wt = ct.load(w, (0,), (TILE_N,), padding_mode=PAD_ZERO).astype(ct.float32)
    ct.store(out, (bid, 0), _normed(s, wt, n, eps, sum_out.dtype, out.dtype), allow_tma=False)


@ct.kernel(occupancy=ADD_OCCUPANCY)
def add_rms_norm_persistent_kernel(
    x, residual, w, sum_out, out, eps, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int]
):
    """``add_rms_norm_kernel`` on a persistent grid: each block loops over row tiles."""
    n = x.shape[1]
    wt = ct.load(w, (0,), (TILE_N,), padding_mode=PAD_ZERO).astype(ct.float32)
    for t in range(ct.bid(0), ct.cdiv(x.shape[0], TILE_M), ct.num_blocks(0)):
        xt = ct.load(x, (t, 0), (TILE_M, TILE_N), padding_mode=PAD_ZERO, latency=10)
        rt = ct.load(residual, (t, 0), (TILE_M, TILE_N), padding_mode=PAD_ZERO, latency=10)
        s = (xt.astype(ct.float32) + rt.astype(ct.float32)).astype(sum_out.dtype)
        ct.store(sum_out, (t, 0), s, allow_tma=False)
        ct.store(out, (t, 0), _normed(s, wt, n, eps, sum_out.dtype, out.dtype), allow_tma=False)


#: Variants the benchmark sweeps and the GPU tests check: name -> keyword arguments of
#: ``rms_norm`` / ``add_rms_norm`` (tile_elems, occupancy, persistent). "old" is the first
#: version (no occupancy hint, one CTA per row tile).
VARIANTS = {
    "old": dict(tile_elems=8192, occupancy=None, persistent=False),
    "occ2": dict(tile_elems=8192, occupancy=2, persistent=False),
    "occ4": dict(tile_elems=8192, occupancy=4, persistent=False),
    "occ4-e4096": dict(tile_elems=4096, occupancy=4, persistent=False),
    "occ4-e16384": dict(tile_elems=16384, occupancy=4, persistent=False),
    "pers-occ2": dict(tile_elems=8192, occupancy=2, persistent=True),
    "pers-occ4": dict(tile_elems=8192, occupancy=4, persistent=True),
    "pers-occ2-e16384": dict(tile_elems=16384, occupancy=2, persistent=True),
}

#: Elements per block (whole rows); measured on the H200 in benchmarks/ops/bench_rms_norm.py.
TILE_ELEMS = 8192


def tile_sizes(n: int, tile_elems: int = TILE_ELEMS) -> tuple[int, int]:
    """(TILE_M, TILE_N): whole rows per tile, about ``tile_elems`` elements per block.

    TILE_M does not depend on the row count, so one compiled kernel per hidden size serves
    decode and prefill alike (rows past the end are masked, not loaded).
    """
    tile_n = next_pow2(n)
    return max(1, min(32, tile_elems // tile_n)), tile_n


def plain_kernel(persistent: bool | None = None):
    """The RMSNorm kernel the library launches (``PERSISTENT`` picks the grid style)."""
    pers = PERSISTENT if persistent is None else persistent
    return rms_norm_persistent_kernel if pers else rms_norm_kernel


def fused_kernel(persistent: bool | None = None):
    """The add+RMSNorm kernel the library launches."""
    pers = PERSISTENT if persistent is None else persistent
    return add_rms_norm_persistent_kernel if pers else add_rms_norm_kernel


def _launch(kernel, default_occ, m, x, args, tile_elems, occupancy, persistent):
    n = x.shape[1]
    tm, tn = tile_sizes(n, tile_elems)
    tiles = (m + tm - 1) // tm
    grid = min(tiles, sm_count(x.device) * (occupancy or 1)) if persistent else tiles
    kernel = with_occupancy(kernel, occupancy, default_occ)
    ct.launch(stream(), (grid, 1, 1), kernel, (*args, tm, tn))


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
    *,
    occupancy=DEFAULT,
    persistent: bool | None = None,
) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` (any leading shape), as transformers computes it.

    ``tile_elems``, ``occupancy`` and ``persistent`` pick a kernel variant (benchmark sweeps);
    the defaults are ``TILE_ELEMS``, ``OCCUPANCY`` and ``PERSISTENT``.
    """
    _check(x, weight)
    x2 = _rows(x)
    m, n = x2.shape
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    if m:
        occ = OCCUPANCY if occupancy is DEFAULT else occupancy
        pers = PERSISTENT if persistent is None else persistent
        args = (x2, weight.contiguous(), out, float(eps))
        _launch(plain_kernel(pers), OCCUPANCY, m, x2, args, tile_elems, occ, pers)
    return out.view(*x.shape[:-1], n)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    tile_elems: int = TILE_ELEMS,
    *,
    occupancy=DEFAULT,
    persistent: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual + x, RMSNorm(residual + x)) in one pass; the sum is rounded to x's dtype first.

    Variant arguments as for :func:`rms_norm` (defaults ``ADD_OCCUPANCY``, ``PERSISTENT``).
    """
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
        occ = ADD_OCCUPANCY if occupancy is DEFAULT else occupancy
        pers = PERSISTENT if persistent is None else persistent
        args = (x2, r2, weight.contiguous(), total, out, float(eps))
        _launch(fused_kernel(pers), ADD_OCCUPANCY, m, x2, args, tile_elems, occ, pers)
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
    """Signatures for the AOT gate: every (dtype, hidden size) the models launch, for the
    kernels the library launches by default (``plain_kernel()``, ``fused_kernel()``)."""
    plain, fused = [], []
    for dt in dtypes:
        for n in hidden_sizes:
            tm, tn = tile_sizes(n)
            a2, a1, eps = array_sig(dt, 2), array_sig(dt, 1), ScalarConstraint(ct.float32)
            plain.append(signature(a2, a1, a2, eps, tm, tn))
            fused.append(signature(a2, a2, a1, a2, a2, eps, tm, tn))
    return {plain_kernel(): plain, fused_kernel(): fused}
