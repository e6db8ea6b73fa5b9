"""RMSNorm and fused residual-add + RMSNorm with transformers' numerics.

transformers (e.g. ``Qwen3RMSNorm.forward``, ``LlamaRMSNorm.forward``) upcasts to fp32, takes
the mean of squares, multiplies by ``rsqrt(var + eps)``, casts back to the input dtype and only
then multiplies by the weight (a product rounded to the promoted dtype). The kernels keep every
one of those roundings so the outputs match the PyTorch module, not just an fp32 ideal.

``unit_offset=True`` is Gemma's form (``Gemma3RMSNorm.forward``): the weight is stored as an
offset from one, the normalized row is scaled by ``1 + weight`` in fp32 and rounded once, to
the input dtype. ``rms_norm_add`` is a norm applied after a sub-block and added to the residual
(Gemma's post-attention and post-feedforward norms), optionally followed by the next norm of
the sum (Gemma's pre-feedforward norm): one pass instead of two norms and an add.
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
def rms_norm_kernel(
    x,
    w,
    out,
    eps,
    TILE_M: ct.Constant[int],
    TILE_N: ct.Constant[int],
    OFFSET: ct.Constant[bool],
):
    """out[r] = w * cast(x[r] * rsqrt(mean(x[r]^2) + eps)) for TILE_M rows per block (OFFSET:
    cast(x[r] * rsqrt(...) * (1 + w)))."""
    bid = ct.bid(0)
    n = x.shape[1]
    xt = ct.load(x, (bid, 0), (TILE_M, TILE_N), padding_mode=PAD_ZERO, latency=10)
    wt = ct.load(w, (0,), (TILE_N,), padding_mode=PAD_ZERO).astype(ct.float32)
    ct.store(out, (bid, 0), _normed(xt, wt, n, eps, x.dtype, out.dtype, OFFSET), allow_tma=False)


@ct.function
def _normed(xt, wt, n, eps, in_dtype, out_dtype, OFFSET: ct.Constant[bool]):
    """transformers' RMSNorm of the rows of one tile (fp32 math, the module's roundings):
    the normed row rounded to ``in_dtype``, then times the weight (Llama); with OFFSET the
    normed row times ``1 + weight`` in fp32, rounded once (Gemma)."""
    xf = xt.astype(ct.float32)
    inv = ct.rsqrt(ct.sum(xf * xf, axis=1, keepdims=True) / n + eps)
    w = wt.reshape((1, wt.shape[0]))
    if OFFSET:
        return (xf * inv * (w + 1.0)).astype(out_dtype)
    normed = (xf * inv).astype(in_dtype).astype(ct.float32)
    return (normed * w).astype(out_dtype)


@ct.kernel(occupancy=OCCUPANCY)
def rms_norm_persistent_kernel(
    x,
    w,
    out,
    eps,
    TILE_M: ct.Constant[int],
    TILE_N: ct.Constant[int],
    OFFSET: ct.Constant[bool],
):
    """``rms_norm_kernel`` on a persistent grid: each block loops over row tiles."""
    n = x.shape[1]
    wt = ct.load(w, (0,), (TILE_N,), padding_mode=PAD_ZERO).astype(ct.float32)
    for t in range(ct.bid(0), ct.cdiv(x.shape[0], TILE_M), ct.num_blocks(0)):
        xt = ct.load(x, (t, 0), (TILE_M, TILE_N), padding_mode=PAD_ZERO, latency=10)
        normed = _normed(xt, wt, n, eps, x.dtype, out.dtype, OFFSET)
        ct.store(out, (t, 0), normed, allow_tma=False)


@ct.kernel(occupancy=ADD_OCCUPANCY)
def add_rms_norm_kernel(
    x,
    residual,
    w,
    sum_out,
    out,
    eps,
    TILE_M: ct.Constant[int],
    TILE_N: ct.Constant[int],
    OFFSET: ct.Constant[bool],
):
    """sum_out = x + residual (rounded like PyTorch), out = RMSNorm(sum_out)."""
    bid = ct.bid(0)
    n = x.shape[1]
    xt = ct.load(x, (bid, 0), (TILE_M, TILE_N), padding_mode=PAD_ZERO, latency=10)
    rt = ct.load(residual, (bid, 0), (TILE_M, TILE_N), padding_mode=PAD_ZERO, latency=10)
    s = (xt.astype(ct.float32) + rt.astype(ct.float32)).astype(sum_out.dtype)
    ct.store(sum_out, (bid, 0), s, allow_tma=False)
    wt = ct.load(w, (0,), (TILE_N,), padding_mode=PAD_ZERO).astype(ct.float32)
    normed = _normed(s, wt, n, eps, sum_out.dtype, out.dtype, OFFSET)
    ct.store(out, (bid, 0), normed, allow_tma=False)


@ct.kernel(occupancy=ADD_OCCUPANCY)
def add_rms_norm_persistent_kernel(
    x,
    residual,
    w,
    sum_out,
    out,
    eps,
    TILE_M: ct.Constant[int],
    TILE_N: ct.Constant[int],
    OFFSET: ct.Constant[bool],
):
    """``add_rms_norm_kernel`` on a persistent grid: each block loops over row tiles."""
    n = x.shape[1]
    wt = ct.load(w, (0,), (TILE_N,), padding_mode=PAD_ZERO).astype(ct.float32)
    for t in range(ct.bid(0), ct.cdiv(x.shape[0], TILE_M), ct.num_blocks(0)):
        xt = ct.load(x, (t, 0), (TILE_M, TILE_N), padding_mode=PAD_ZERO, latency=10)
        rt = ct.load(residual, (t, 0), (TILE_M, TILE_N), padding_mode=PAD_ZERO, latency=10)
        s = (xt.astype(ct.float32) + rt.astype(ct.float32)).astype(sum_out.dtype)
        ct.store(sum_out, (t, 0), s, allow_tma=False)
        normed = _normed(s, wt, n, eps, sum_out.dtype, out.dtype, OFFSET)
        ct.store(out, (t, 0), normed, allow_tma=False)


@ct.kernel(occupancy=ADD_OCCUPANCY)
def rms_norm_add_kernel(
    x,
    residual,
    w,
    w_next,
    sum_out,
    out,
    eps,
    TILE_M: ct.Constant[int],
    TILE_N: ct.Constant[int],
    NEXT: ct.Constant[bool],
    OFFSET: ct.Constant[bool],
):
    """sum_out = residual + RMSNorm_w(x), the norm rounded to sum_out's dtype and the sum
    rounded like PyTorch's add; with NEXT also out = RMSNorm_w_next(sum_out) (else ``w_next``
    and ``out`` are placeholders, neither read nor written)."""
    bid = ct.bid(0)
    n = x.shape[1]
    xt = ct.load(x, (bid, 0), (TILE_M, TILE_N), padding_mode=PAD_ZERO, latency=10)
    rt = ct.load(residual, (bid, 0), (TILE_M, TILE_N), padding_mode=PAD_ZERO, latency=10)
    wt = ct.load(w, (0,), (TILE_N,), padding_mode=PAD_ZERO).astype(ct.float32)
    normed = _normed(xt, wt, n, eps, x.dtype, sum_out.dtype, OFFSET).astype(ct.float32)
    s = (rt.astype(ct.float32) + normed).astype(sum_out.dtype)
    ct.store(sum_out, (bid, 0), s, allow_tma=False)
    if NEXT:
        wn = ct.load(w_next, (0,), (TILE_N,), padding_mode=PAD_ZERO).astype(ct.float32)
        normed_next = _normed(s, wn, n, eps, sum_out.dtype, out.dtype, OFFSET)
        ct.store(out, (bid, 0), normed_next, allow_tma=False)


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


def _launch(kernel, default_occ, m, x, args, tile_elems, occupancy, persistent, consts=()):
    n = x.shape[1]
    tm, tn = tile_sizes(n, tile_elems)
    tiles = (m + tm - 1) // tm
    grid = min(tiles, sm_count(x.device) * (occupancy or 1)) if persistent else tiles
    kernel = with_occupancy(kernel, occupancy, default_occ)
    ct.launch(stream(), (grid, 1, 1), kernel, (*args, tm, tn, *consts))


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


def norm_dtype(x: torch.Tensor, weight: torch.Tensor, unit_offset: bool = False) -> torch.dtype:
    """The dtype of a norm's output: the promoted one (Llama), or x's (Gemma's ``type_as``)."""
    return x.dtype if unit_offset else torch.promote_types(x.dtype, weight.dtype)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    tile_elems: int = TILE_ELEMS,
    *,
    unit_offset: bool = False,
    occupancy=DEFAULT,
    persistent: bool | None = None,
) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` (any leading shape), as transformers computes it
    (``unit_offset``: Gemma's ``(1 + weight)`` form, see the module doc).

    ``tile_elems``, ``occupancy`` and ``persistent`` pick a kernel variant (benchmark sweeps);
    the defaults are ``TILE_ELEMS``, ``OCCUPANCY`` and ``PERSISTENT``.
    """
    _check(x, weight)
    x2 = _rows(x)
    m, n = x2.shape
    out = torch.empty((m, n), dtype=norm_dtype(x, weight, unit_offset), device=x.device)
    if m:
        occ = OCCUPANCY if occupancy is DEFAULT else occupancy
        pers = PERSISTENT if persistent is None else persistent
        args = (x2, weight.contiguous(), out, float(eps))
        kernel = plain_kernel(pers)
        consts = (bool(unit_offset),)
        _launch(kernel, OCCUPANCY, m, x2, args, tile_elems, occ, pers, consts)
    return out.view(*x.shape[:-1], n)


def _check_residual(x: torch.Tensor, residual: torch.Tensor) -> None:
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(
            f"residual {tuple(residual.shape)}/{residual.dtype} must match x "
            f"{tuple(x.shape)}/{x.dtype}"
        )


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    tile_elems: int = TILE_ELEMS,
    *,
    unit_offset: bool = False,
    occupancy=DEFAULT,
    persistent: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual + x, RMSNorm(residual + x)) in one pass; the sum is rounded to x's dtype first.

    ``unit_offset`` as for :func:`rms_norm`; variant arguments as for :func:`rms_norm`
    (defaults ``ADD_OCCUPANCY``, ``PERSISTENT``).
    """
    _check(x, weight)
    _check_residual(x, residual)
    x2, r2 = _rows(x), _rows(residual)
    m, n = x2.shape
    total = torch.empty((m, n), dtype=x.dtype, device=x.device)
    out = torch.empty((m, n), dtype=norm_dtype(x, weight, unit_offset), device=x.device)
    if m:
        occ = ADD_OCCUPANCY if occupancy is DEFAULT else occupancy
        pers = PERSISTENT if persistent is None else persistent
        args = (x2, r2, weight.contiguous(), total, out, float(eps))
        kernel = fused_kernel(pers)
        consts = (bool(unit_offset),)
        _launch(kernel, ADD_OCCUPANCY, m, x2, args, tile_elems, occ, pers, consts)
    shape = (*x.shape[:-1], n)
    return total.view(shape), out.view(shape)


def rms_norm_add(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    next_weight: torch.Tensor | None = None,
    *,
    unit_offset: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``residual + RMSNorm(x)`` (a norm after a sub-block, added to the residual) and, with
    ``next_weight``, the RMSNorm of that sum by ``next_weight`` (the next sub-block's input);
    ``(sum, None)`` without. One pass over x and the residual.

    The norm of x is rounded to x's dtype before the add, as the PyTorch module's output is;
    the sum is rounded to x's dtype like PyTorch's add. ``unit_offset`` as for :func:`rms_norm`
    (both norms have the same form).
    """
    if norm_dtype(x, weight, unit_offset) != x.dtype:
        raise ValueError(
            f"the norm of x ({x.dtype}) by a {weight.dtype} weight is not in x's dtype; "
            "rms_norm_add adds it to the residual in x's dtype"
        )
    _check(x, weight)
    _check_residual(x, residual)
    if next_weight is not None:
        _check(x, next_weight)
    x2, r2 = _rows(x), _rows(residual)
    m, n = x2.shape
    total = torch.empty((m, n), dtype=x.dtype, device=x.device)
    nxt = next_weight is not None
    out = None
    if nxt:
        out = torch.empty((m, n), dtype=norm_dtype(x, next_weight, unit_offset), device=x.device)
    if m:
        w = weight.contiguous()
        w_next = next_weight.contiguous() if nxt else w
        args = (x2, r2, w, w_next, total, out if nxt else total, float(eps))
        tm, tn = tile_sizes(n)
        grid = ((m + tm - 1) // tm, 1, 1)
        ct.launch(stream(), grid, rms_norm_add_kernel, (*args, tm, tn, nxt, bool(unit_offset)))
    shape = (*x.shape[:-1], n)
    return total.view(shape), (out.view(shape) if nxt else None)


def rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False
) -> torch.Tensor:
    """transformers' RMSNorm forward, verbatim in PyTorch (``LlamaRMSNorm``; with
    ``unit_offset`` ``Gemma3RMSNorm``)."""
    if unit_offset:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return (h * (1.0 + weight.float())).type_as(x)
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


def add_rms_norm_reference(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    unit_offset: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoder layer's ``residual + hidden_states`` followed by its RMSNorm."""
    total = residual + x
    return total, rms_norm_reference(total, weight, eps, unit_offset)


def rms_norm_add_reference(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    next_weight: torch.Tensor | None = None,
    unit_offset: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gemma 3's ``residual + norm(hidden_states)`` and, with ``next_weight``, the next norm of
    that sum, as the decoder layer computes them."""
    total = residual + rms_norm_reference(x, weight, eps, unit_offset)
    if next_weight is None:
        return total, None
    return total, rms_norm_reference(total, next_weight, eps, unit_offset)


def aot_signatures(
    hidden_sizes=(64, 128, 1024, 2048, 4096, 8192),
    dtypes=AOT_DTYPES,
    unit_offsets=(False,),
    ops=("plain", "fused"),
) -> dict:
    """Signatures for the AOT gate: every (dtype, hidden size, norm form) the models launch,
    for the kernels the library launches by default: ``plain_kernel()`` ("plain"),
    ``fused_kernel()`` ("fused") and ``rms_norm_add_kernel`` ("norm_add": with and without the
    next norm)."""
    out: dict = {}
    for dt in dtypes:
        for n in hidden_sizes:
            for offset in unit_offsets:
                tm, tn = tile_sizes(n)
                a2, a1, eps = array_sig(dt, 2), array_sig(dt, 1), ScalarConstraint(ct.float32)
                if "plain" in ops:
                    sig = signature(a2, a1, a2, eps, tm, tn, offset)
                    out.setdefault(plain_kernel(), []).append(sig)
                if "fused" in ops:
                    sig = signature(a2, a2, a1, a2, a2, eps, tm, tn, offset)
                    out.setdefault(fused_kernel(), []).append(sig)
                if "norm_add" in ops:
                    for nxt in (False, True):
                        sig = signature(a2, a2, a1, a1, a2, a2, eps, tm, tn, nxt, offset)
                        out.setdefault(rms_norm_add_kernel, []).append(sig)
    return out
