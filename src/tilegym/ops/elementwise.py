"""Elementwise residual add: the ``residual + hidden_states`` of a decoder layer."""

from __future__ import annotations

import cuda.tile as ct
import torch

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

#: Most elements per block (8 KB of bf16 per input tile: 8 x 16-byte loads per thread and input
#: at 128 threads, 83 registers, no spills on sm_90; 8192 needs 128+ registers). The first
#: version used 2048 elements and no occupancy hint: at prefill sizes thousands of short blocks,
#: and it lost to PyTorch's ``a + b`` (0.86-0.91x on the H200,
#: docs/results/h200-2026-11-29/ops/norms_rope_silu.txt).
TILE = 4096
#: Fewest elements per block: small inputs (decode) use smaller tiles so that the grid still
#: spreads over about one block per SM instead of one or two blocks doing all the loads.
MIN_TILE = 1024
#: Resident blocks per SM the compiler is told to allow (``ct.kernel(occupancy=...)``; caps
#: registers per thread; ``None`` = the compiler's choice).
OCCUPANCY = 4
#: Persistent grid (about ``OCCUPANCY`` blocks per SM looping over the tiles) instead of one
#: block per tile.
PERSISTENT = False

#: Variants the benchmark sweeps and the GPU tests check: name -> keyword arguments of ``add``.
#: "old" is the first version (2048-element tiles, no occupancy hint, one block per tile);
#: "fixed" = no smaller tiles for small inputs; "pers" = persistent grid.
VARIANTS = {
    "default": dict(),
    "old": dict(tile=2048, occupancy=None, min_tile=2048),
    "t4k-fixed": dict(tile=4096, occupancy=4, min_tile=4096),
    "t2k-o8": dict(tile=2048, occupancy=8),
    "t8k-o4": dict(tile=8192, occupancy=4),
    "t8k-o2": dict(tile=8192, occupancy=2),
    "pers-t4k-o4": dict(tile=4096, occupancy=4, persistent=True),
    "pers-t8k-o2": dict(tile=8192, occupancy=2, persistent=True),
}


@ct.function
def _add_tile(a, b, out, i, TILE_N: ct.Constant[int]):
    x = ct.load(a, (i,), (TILE_N,), padding_mode=PAD_ZERO, latency=10).astype(ct.float32)
    y = ct.load(b, (i,), (TILE_N,), padding_mode=PAD_ZERO, latency=10).astype(ct.float32)
    ct.store(out, (i,), (x + y).astype(out.dtype), allow_tma=False)


@ct.kernel(occupancy=OCCUPANCY)
def add_kernel(a, b, out, TILE_N: ct.Constant[int]):
    """out = a + b over flat arrays, rounded once to out's dtype; one tile per block."""
    _add_tile(a, b, out, ct.bid(0), TILE_N)


@ct.kernel(occupancy=OCCUPANCY)
def add_persistent_kernel(a, b, out, TILE_N: ct.Constant[int]):
    """``add_kernel`` on a persistent grid: each block loops over tiles."""
    for i in range(ct.bid(0), ct.cdiv(a.shape[0], TILE_N), ct.num_blocks(0)):
        _add_tile(a, b, out, i, TILE_N)


def tile_size(n: int, tile: int = TILE, min_tile: int = MIN_TILE, sms: int = 132) -> int:
    """Elements per block: ``tile``, or less (a power of two >= ``min_tile``) when ``n`` is too
    small to give each of the ``sms`` SMs a block."""
    return max(min(tile, min_tile), min(tile, next_pow2(-(-n // sms))))


def add(
    a: torch.Tensor,
    b: torch.Tensor,
    tile: int = TILE,
    *,
    occupancy=DEFAULT,
    persistent: bool | None = None,
    min_tile: int = MIN_TILE,
) -> torch.Tensor:
    """``a + b`` for same-shape, same-dtype tensors (the decoder layer's residual adds).

    ``tile`` (most elements per block), ``occupancy``, ``persistent`` and ``min_tile`` pick a
    kernel variant (defaults: the module constants)."""
    check_activation("a", a)
    check_activation("b", b)
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"add needs matching shapes/dtypes: {tuple(a.shape)} vs {tuple(b.shape)}")
    out = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    n = out.numel()
    if not n:
        return out
    a1 = a.view(-1) if a.is_contiguous() else a.reshape(-1)
    b1 = b.view(-1) if b.is_contiguous() else b.reshape(-1)
    t = tile_size(n, tile, min_tile, sm_count(a.device))
    occ = OCCUPANCY if occupancy is DEFAULT else occupancy
    ntiles = (n + t - 1) // t
    if PERSISTENT if persistent is None else persistent:
        kernel = with_occupancy(add_persistent_kernel, occ, OCCUPANCY)
        grid = min(ntiles, sm_count(a.device) * (occ or 1))
    else:
        kernel, grid = with_occupancy(add_kernel, occ, OCCUPANCY), ntiles
    ct.launch(stream(), (grid, 1, 1), kernel, (a1, b1, out.view(-1), t))
    return out


def add_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The PyTorch op the kernel replaces."""
    return a + b


def aot_signatures(dtypes=AOT_DTYPES) -> dict:
    """Signatures for the AOT gate: the default kernel at every tile size it can pick."""
    kernel = add_persistent_kernel if PERSISTENT else add_kernel
    tiles = [1 << i for i in range(MIN_TILE.bit_length() - 1, TILE.bit_length())]
    return {kernel: [signature(*(array_sig(dt, 1),) * 3, t) for dt in dtypes for t in tiles]}
