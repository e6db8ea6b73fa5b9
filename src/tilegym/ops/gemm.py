"""cuTile GEMMs for the linear projections of transformer models.

`linear` computes `x @ W^T (+ bias)`, `linear_residual` adds a residual in the epilogue
(o_proj, down_proj) and `fused_gate_up_silu` computes `silu(x @ Wg^T) * (x @ Wu^T)` from a
weight packed once as `[gate; up]`, so the `[M, 2I]` intermediate never reaches memory;
`fused_gate_up_gelu_tanh` is the same GEMM with GELU's tanh approximation (Gemma's GeGLU).
All accumulate in fp32. Weights stay in their `[N, K]` nn.Linear layout: the kernels read them
K-major through a transposed tile load, so no per-call copy is made.

Tile shapes come from `gemm_configs` (an H200-measured table). A one-row GEMM (decode at batch
1) mostly takes the GEMV kernel (`TileConfig.gemv`): plain 16-byte loads and fp32 multiply-adds,
without the TMA + mma pipeline whose fixed latency dominates a few-microsecond stream of W.
With `GEMV_PDL` it is launched as a programmatic dependent of the previous kernel: each block
loads its first W tile before waiting for that kernel's writes, for a weight no kernel can have
just written (`_pdl_ready`). `rms_norm_linear` puts a layer's input RMSNorm into the GEMV's
K loop (`tilegym_norm_gemv_kernel`): one launch where the norm kernel and the GEMV were two;
`rms_norm_gate_up` does the same for the MLP's gate/up GEMV and its activation.
Other decode GEMMs mostly swap the mma's operands (`TileConfig.swap`, `_mma_step`).
Split-K (`TileConfig.split`)
gives each split a contiguous share of the K tiles and has it store its fp32 partial tile into
a workspace; the partials are then summed and the epilogue applied either by the last split of
an output tile to arrive (`reduce="cta"`: one launch, per-tile atomic counter, reset by that
split) or by a reduction kernel launched as a programmatic dependent (`reduce="pdl"`).
Partials are written and read without TMA: TMA is an asynchronous copy engine whose stores are
not ordered by the counter's acquire/release atomic, which made the last-CTA sum read stale
partials on the H200.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import cuda.tile as ct
import torch

from tilegym.ops import rms_norm as _rms_norm
from tilegym.ops._common import buffers_private, sm_count, stream, with_hints
from tilegym.ops.gelu_and_mul import gelu_tanh
from tilegym.ops.gemm_configs import DECODE_MAX_M, TileConfig, choose_config, default_config
from tilegym.ops.kv_cache import check_device_counters

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
_ZERO = ct.PaddingMode.ZERO
_COUNTER_SLOTS = 1 << 16

#: W-load latency hint of the GEMV kernel when its config leaves it to the compiler (0)
GEMV_LATENCY = 10
#: The GEMV kernel keeps per-element products over K (a (TM, TN, TK) fp32 accumulator) and
#: reduces once after its K loop when the tile has at most this many elements (32 registers
#: per thread at 128 threads); bigger tiles reduce every K step. The per-step reduction is a
#: cross-warp sum through shared memory with barriers (sm_90 SASS: 6 per step), which keeps
#: the next K step's loads from being issued before it ends.
GEMV_ACC_ELEMS = 4096
#: True: the GEMV kernel is launched as a programmatic dependent of the previous kernel in the
#: stream and loads its first W tile before waiting for it (`_gemv_first`). On an H100, in a
#: graph of 28 x (RMSNorm, copy, GEMV + residual) (`benchmarks/ops/bench_gemv_pdl.py`) it took
#: the 1024x3072 layer from 9.89 to 8.88 us and the 1024x2048 one from 8.07 to 7.99 us (within
#: the spread). The early W load is only taken for a weight an earlier GEMV read at its current
#: version (`_pdl_ready`): a lazily built weight (a class-level patch's `FusedWeights.get` /
#: `.scaled`, built by the kernel right before its first GEMV) and a weight written in place
#: since its last read launch without PDL once. End to end (static generate, 1 x 2048 -> 128,
#: H100) the GPU time a token went from 6.462 to 6.440 ms (olmo3) and 1.468 to 1.445 (qwen3).
GEMV_PDL = True
#: Programmatic dependent launch of the mma GEMM kernels (`tilegym_linear_kernel`,
#: `tilegym_gate_up_silu_kernel`). "off": neither. "trigger": each block first lets the next
#: kernel's blocks be placed (`_mma_pdl_start`), so a GEMV after it (`GEMV_PDL`) loads its first
#: W tile on the SMs a one-wave decode GEMM leaves free; the GEMM itself starts as usual.
#: "dependent": that, and the GEMM is launched as a programmatic dependent too, waiting for the
#: kernel before it before any global access (no access comes before the wait, so any weight
#: is safe). `benchmarks/ops/bench_mma_pdl.py` times the three.
MMA_PDL = "off"
MMA_PDL_MODES = ("off", "trigger", "dependent")

#: SPLIT_MODE of the GEMM kernels: no split, split with last-CTA sum, split writing partials only
NO_SPLIT, SPLIT_CTA, SPLIT_PARTIAL = 0, 1, 2

#: ACT of the gated kernels: the activation applied to the gate before the product with up
ACT_SILU, ACT_GELU_TANH = 0, 1


def _tile_coords(m, n, tm, tn, group_m, bid=None):
    """Grouped (swizzled) coordinates of output tile `bid` (default: this CTA's), so that
    neighbouring tiles reuse W tiles from L2."""
    if bid is None:
        bid = ct.bid(0)
    num_m = ct.cdiv(m, tm)
    num_n = ct.cdiv(n, tn)
    per_group = group_m * num_n
    group = bid // per_group
    first_m = group * group_m
    rows = min(num_m - first_m, group_m)
    return first_m + (bid % rows), (bid % per_group) // rows


def _load_tile(a, index, shape, latency, order="C"):
    """Zero-padded tile load; ``latency`` 0 leaves the hint to the compiler (ct.load: 1..10)."""
    if latency > 0:
        return ct.load(
            a, index=index, shape=shape, order=order, padding_mode=_ZERO, latency=latency
        )
    return ct.load(a, index=index, shape=shape, order=order, padding_mode=_ZERO)


def _load_x(x, bm, k, tm, tk, latency):
    return _load_tile(x, (bm, k), (tm, tk), latency)


def _load_wt(w, bn, k, tn, tk, latency, transpose_tile):
    """Tile `W[bn*tn : , k*tk : ]^T` of shape (tk, tn) from the [N, K] weight.

    transpose_tile: load the tile in W's own K-contiguous layout and transpose it as a tile;
    otherwise load through a transposed (order=(1, 0)) view. Which is faster is measured.
    """
    if transpose_tile:
        return ct.transpose(_load_tile(w, (bn, k), (tn, tk), latency))
    return _load_tile(w, (k, bn), (tk, tn), latency, order=(1, 0))


def _acc_zeros(tm, tn, swap):
    """fp32 accumulator: (TM, TN), or (TN, TM) when the mma runs with swapped operands."""
    if swap:
        return ct.full((tn, tm), 0, dtype=ct.float32)
    return ct.full((tm, tn), 0, dtype=ct.float32)


def _x_operand(x, bm, k, tm, tk, latency, transpose_tile, swap):
    """The X tile of K step ``k`` as the mma wants it: (TM, TK), or X^T (TK, TM) when swapped
    (transpose_tile picks a tile transpose or an order view, as it does for W otherwise)."""
    if not swap:
        return _load_x(x, bm, k, tm, tk, latency)
    if transpose_tile:
        return ct.transpose(_load_x(x, bm, k, tm, tk, 0))
    return _load_tile(x, (k, bm), (tk, tm), 0, order=(1, 0))


def _mma_with(xop, w, acc, bn, k, tn, tk, latency, transpose_tile, swap):
    """acc += the X operand (`_x_operand`) times W tile ``(bn, k)``^T."""
    if swap:
        return ct.mma(_load_tile(w, (bn, k), (tn, tk), latency), xop, acc)
    return ct.mma(xop, _load_wt(w, bn, k, tn, tk, latency, transpose_tile), acc)


def _mma_step(x, w, acc, bm, bn, k, tm, tn, tk, latency, transpose_tile, swap):
    """acc += X tile @ W tile^T for K tile ``k``.

    swap: the (TN, TK) W tile is the mma's A operand and the (TM, TK) X tile, transposed, its B
    (acc is then (TN, TM)). For a few rows this puts W's rows on the mma's M side, where
    Hopper's warpgroup mma wants 64 of them, and leaves only the token count (8 or 16) on N;
    the W tile is then read as stored, K-contiguous, with no transpose.
    """
    xop = _x_operand(x, bm, k, tm, tk, latency, transpose_tile, swap)
    return _mma_with(xop, w, acc, bn, k, tn, tk, latency, transpose_tile, swap)


def _acc_out(acc, swap):
    """The accumulator as the (TM, TN) output tile."""
    return ct.transpose(acc) if swap else acc


def _sum_partials(ws, base, split, bm, bn, tm, tn):
    acc = ct.full((tm, tn), 0, dtype=ct.float32)
    for s in range(split):
        part = ct.load(
            ws, index=(base + s, bm, bn), shape=(1, tm, tn), padding_mode=_ZERO, allow_tma=False
        )
        acc = acc + ct.reshape(part, (tm, tn))
    return acc


def _k_tile(k, k_first, k_last, bn, stagger):
    """The K tile a block loads at step ``k`` of its share ``[k_first, k_last)``: ``k`` itself,
    or (stagger) the share rotated to start at the block's N tile index mod its length, so that
    at any moment neighbouring blocks stream different K columns of W rather than the same
    ones (decode GEMMs on the H200: +0.2 to +3.6 points of % of cuBLAS over 16 placements of W,
    docs/results/h200-2026-11-30/ops/gemm_gate_up_placements.txt)."""
    if stagger:
        return k_first + (k - k_first + bn) % (k_last - k_first)
    return k


def _k_share(k_tiles, split, s):
    """[first, last) K tiles of split `s`: contiguous, near-equal shares."""
    per = ct.cdiv(k_tiles, split)
    first = s * per
    return first, ct.minimum(first + per, k_tiles)


def _store_partial(ws, index, acc, tm, tn):
    ct.store(ws, index=index, tile=ct.reshape(acc, (1, tm, tn)), allow_tma=False)


def _linear_epilogue(acc, b, r, y, bm, bn, tm, tn, has_bias, has_res):
    if has_bias:
        bias = ct.load(b, index=(bn,), shape=(tn,), padding_mode=_ZERO)
        acc = acc + ct.reshape(ct.astype(bias, ct.float32), (1, tn))
    if has_res:
        res = ct.load(r, index=(bm, bn), shape=(tm, tn), padding_mode=_ZERO)
        acc = acc + ct.astype(res, ct.float32)
    ct.store(y, index=(bm, bn), tile=ct.astype(acc, y.dtype))


@ct.function
def _mma_pdl_start(PDL: ConstBool):
    """PDL: let this kernel's own programmatic dependents start, then wait for the kernel
    before (a no-op unless this launch is itself a dependent; every global access of the GEMM
    comes after). Loading W's first tile before the wait, as the GEMV kernels do, does not
    carry over: the compiler issues an mma's TMA loads after the wait wherever the load is
    written, and plain loads of a whole mma tile would take over a hundred registers a
    thread."""
    if PDL:
        ct.grid_dependency_control_launch_dependents()
        ct.grid_dependency_control_wait()


@ct.kernel
def tilegym_linear_kernel(
    X,
    W,
    B,
    R,
    Y,
    WS,
    CNT,
    split: int,
    TM: ConstInt,
    TN: ConstInt,
    TK: ConstInt,
    GROUP_M: ConstInt,
    LATENCY: ConstInt,
    TRANSPOSE_TILE: ConstBool,
    SPLIT_MODE: ConstInt,
    HAS_BIAS: ConstBool,
    HAS_RES: ConstBool,
    SWAP: ConstBool,
    STAGGER: ConstBool,
    PDL: ConstBool,
):
    """Y[M, N] = X[M, K] @ W[N, K]^T (+ B[N]) (+ R[M, N]); grid (tiles, split).

    SPLIT_MODE (compile-time): NO_SPLIT, SPLIT_CTA or SPLIT_PARTIAL; `split` (runtime) is the
    split count. SWAP: operands swapped in the mma (`_mma_step`); STAGGER: K order `_k_tile`.
    PDL: the programmatic-dependent-launch code of `MMA_PDL` (`_mma_pdl_start`).
    """
    m = X.shape[0]
    n = W.shape[0]
    bm, bn = _tile_coords(m, n, TM, TN, GROUP_M)
    s = ct.bid(1)
    k_tiles = ct.num_tiles(X, axis=1, shape=(TM, TK))
    k_first, k_last = _k_share(k_tiles, split, s)
    acc = _acc_zeros(TM, TN, SWAP)
    _mma_pdl_start(PDL)
    for k0 in range(k_first, k_last):
        k = _k_tile(k0, k_first, k_last, bn, STAGGER)
        acc = _mma_step(X, W, acc, bm, bn, k, TM, TN, TK, LATENCY, TRANSPOSE_TILE, SWAP)
    acc = _acc_out(acc, SWAP)
    if SPLIT_MODE == NO_SPLIT:
        _linear_epilogue(acc, B, R, Y, bm, bn, TM, TN, HAS_BIAS, HAS_RES)
    elif SPLIT_MODE == SPLIT_PARTIAL:
        _store_partial(WS, (s, bm, bn), acc, TM, TN)
    else:
        _store_partial(WS, (s, bm, bn), acc, TM, TN)
        tile_id = bm * ct.cdiv(n, TN) + bn
        arrived = ct.atomic_add(CNT, tile_id, 1)
        if arrived == split - 1:
            total = _sum_partials(WS, 0, split, bm, bn, TM, TN)
            _linear_epilogue(total, B, R, Y, bm, bn, TM, TN, HAS_BIAS, HAS_RES)
            ct.atomic_xchg(CNT, tile_id, 0)


@ct.kernel
def tilegym_linear_persistent_kernel(
    X,
    W,
    B,
    R,
    Y,
    TM: ConstInt,
    TN: ConstInt,
    TK: ConstInt,
    GROUP_M: ConstInt,
    LATENCY: ConstInt,
    TRANSPOSE_TILE: ConstBool,
    HAS_BIAS: ConstBool,
    HAS_RES: ConstBool,
    SWAP: ConstBool,
    STAGGER: ConstBool,
):
    """`tilegym_linear_kernel` unsplit, with each block looping over output tiles (grid of
    about one wave): a tile's epilogue store can overlap the next tile's first loads, which
    matters when the output is large next to K (lm_head, packed projections at prefill)."""
    m = X.shape[0]
    n = W.shape[0]
    tiles = ct.cdiv(m, TM) * ct.cdiv(n, TN)
    k_tiles = ct.num_tiles(X, axis=1, shape=(TM, TK))
    for t in range(ct.bid(0), tiles, ct.num_blocks(0)):
        bm, bn = _tile_coords(m, n, TM, TN, GROUP_M, t)
        acc = _acc_zeros(TM, TN, SWAP)
        for k0 in range(k_tiles):
            k = _k_tile(k0, 0, k_tiles, bn, STAGGER)
            acc = _mma_step(X, W, acc, bm, bn, k, TM, TN, TK, LATENCY, TRANSPOSE_TILE, SWAP)
        _linear_epilogue(_acc_out(acc, SWAP), B, R, Y, bm, bn, TM, TN, HAS_BIAS, HAS_RES)


@ct.kernel
def tilegym_gemv_kernel(
    X,
    W,
    B,
    R,
    Y,
    TM: ConstInt,
    TN: ConstInt,
    TK: ConstInt,
    LATENCY: ConstInt,
    HAS_BIAS: ConstBool,
    HAS_RES: ConstBool,
    PDL: ConstBool,
):
    """`tilegym_linear_kernel` for a few rows; grid (N tiles, M tiles).

    Decode GEMMs are latency-bound streams of W: here each block issues plain (non-TMA)
    16-byte loads of a (TN, TK) W tile, multiplies by the (TM, TK) rows of X broadcast over TN
    and sums over K in fp32; no shared-memory staging, barriers or mma.

    PDL: launched as a programmatic dependent of the previous kernel, the block loads its first
    W tile, then waits for that kernel's memory; X, B and R are read and Y written after.
    """
    bn = ct.bid(0)
    bm = ct.bid(1)
    if TM * TN * TK <= GEMV_ACC_ELEMS:
        acc = _gemv_sum_last(X, W, bm, bn, TM, TN, TK, LATENCY, PDL)
    else:
        acc = _gemv_sum_each(X, W, bm, bn, TM, TN, TK, LATENCY, PDL)
    _linear_epilogue(acc, B, R, Y, bm, bn, TM, TN, HAS_BIAS, HAS_RES)


@ct.function
def _gemv_w(W, bn, k, TN: ConstInt, TK: ConstInt, LATENCY: ConstInt):
    """The (TN, TK) W tile of K step ``k``."""
    return ct.load(W, (bn, k), (TN, TK), padding_mode=_ZERO, latency=LATENCY, allow_tma=False)


@ct.function
def _gemv_products(X, w, bm, k, TM: ConstInt, TN: ConstInt, TK: ConstInt):
    """fp32 (TM, TN, TK) products of K step ``k``: X rows broadcast over the W tile's rows."""
    x = ct.load(X, (bm, k), (TM, TK), padding_mode=_ZERO, allow_tma=False)
    return x.astype(ct.float32).reshape((TM, 1, TK)) * w.astype(ct.float32).reshape((1, TN, TK))


@ct.function
def _gemv_first(
    X, W, bm, bn, TM: ConstInt, TN: ConstInt, TK: ConstInt, LATENCY: ConstInt, PDL: ConstBool
):
    """The products of K step 0. PDL: W's tile is loaded before waiting for the previous
    kernel (weights are never written by it), X after."""
    w = _gemv_w(W, bn, 0, TN, TK, LATENCY)
    if PDL:
        ct.grid_dependency_control_wait()
    return _gemv_products(X, w, bm, 0, TM, TN, TK)


@ct.function
def _gemv_sum_last(
    X, W, bm, bn, TM: ConstInt, TN: ConstInt, TK: ConstInt, LATENCY: ConstInt, PDL: ConstBool
):
    """(TM, TN) dot products: products summed elementwise over K steps, reduced once."""
    # 0 + products, as when the loop started from zeros: a -0 product sums to +0 as before
    acc = ct.full((TM, TN, TK), 0, dtype=ct.float32)
    acc = acc + _gemv_first(X, W, bm, bn, TM, TN, TK, LATENCY, PDL)
    for k in range(1, ct.num_tiles(W, axis=1, shape=(TN, TK))):
        acc = acc + _gemv_products(X, _gemv_w(W, bn, k, TN, TK, LATENCY), bm, k, TM, TN, TK)
    return ct.sum(acc, axis=2)


@ct.function
def _gemv_sum_each(
    X, W, bm, bn, TM: ConstInt, TN: ConstInt, TK: ConstInt, LATENCY: ConstInt, PDL: ConstBool
):
    """(TM, TN) dot products, reduced every K step (tiles too big to keep the products)."""
    acc = ct.full((TM, TN), 0, dtype=ct.float32)
    acc = acc + ct.sum(_gemv_first(X, W, bm, bn, TM, TN, TK, LATENCY, PDL), axis=2)
    for k in range(1, ct.num_tiles(W, axis=1, shape=(TN, TK))):
        w = _gemv_w(W, bn, k, TN, TK, LATENCY)
        acc = acc + ct.sum(_gemv_products(X, w, bm, k, TM, TN, TK), axis=2)
    return acc


@ct.kernel
def tilegym_norm_gemv_kernel(
    X,
    NW,
    W,
    B,
    Y,
    eps: float,
    TM: ConstInt,
    TN: ConstInt,
    TK: ConstInt,
    LATENCY: ConstInt,
    HAS_BIAS: ConstBool,
    OFFSET: ConstBool,
    PDL: ConstBool,
):
    """`tilegym_gemv_kernel` of RMSNorm(X) with the norm weight NW: Y = RMSNorm(X) @ W^T (+ B).

    The block's K loop reads every X element anyway, so it also sums X's squares and multiplies
    X by NW (OFFSET: by 1 + NW) before the products; the row's ``rsqrt(mean(x^2) + eps)`` scales
    the dot products once at the end. No norm launch, no normed row written and read back; the
    normed row is not rounded to the input dtype on the way (closer to fp32 than the module)."""
    bn = ct.bid(0)
    bm = ct.bid(1)
    k_tiles = ct.num_tiles(W, axis=1, shape=(TN, TK))
    w = _gemv_w(W, bn, 0, TN, TK, LATENCY)
    if PDL:
        ct.grid_dependency_control_wait()
    x, xw = _gemv_normed_x(X, NW, bm, 0, TM, TK, OFFSET)
    sq = x * x
    if TM * TN * TK <= GEMV_ACC_ELEMS:
        acc = ct.full((TM, TN, TK), 0, dtype=ct.float32)
        acc = acc + _gemv_scaled(xw, w, TM, TN, TK)
        for k in range(1, k_tiles):
            w = _gemv_w(W, bn, k, TN, TK, LATENCY)
            x, xw = _gemv_normed_x(X, NW, bm, k, TM, TK, OFFSET)
            sq = sq + x * x
            acc = acc + _gemv_scaled(xw, w, TM, TN, TK)
        dots = ct.sum(acc, axis=2)
    else:
        dots = ct.sum(_gemv_scaled(xw, w, TM, TN, TK), axis=2)
        for k in range(1, k_tiles):
            w = _gemv_w(W, bn, k, TN, TK, LATENCY)
            x, xw = _gemv_normed_x(X, NW, bm, k, TM, TK, OFFSET)
            sq = sq + x * x
            dots = dots + ct.sum(_gemv_scaled(xw, w, TM, TN, TK), axis=2)
    inv = ct.rsqrt(ct.sum(sq, axis=1, keepdims=True) / X.shape[1] + eps)
    _linear_epilogue(dots * inv, B, B, Y, bm, bn, TM, TN, HAS_BIAS, False)


@ct.kernel
def tilegym_norm_gate_up_gemv_kernel(
    X,
    NW,
    WG,
    WU,
    Y,
    eps: float,
    TM: ConstInt,
    TN: ConstInt,
    TK: ConstInt,
    LATENCY: ConstInt,
    OFFSET: ConstBool,
    ACT: ConstInt,
    PDL: ConstBool,
):
    """Y = act(RMSNorm(X) @ WG^T) * (RMSNorm(X) @ WU^T) for a few rows (the MLP's norm, gate/up
    GEMV and activation in one launch); the norm as in `tilegym_norm_gemv_kernel`, both
    weights' tiles loaded before the PDL wait, the products reduced every K step."""
    bn = ct.bid(0)
    bm = ct.bid(1)
    gate, up = _norm_pair_dots(
        X, NW, WG, WU, bm, bn, bn, eps, TM, TN, TK, LATENCY, OFFSET, PDL, True
    )
    _act_mul_store(gate, up, Y, bm, bn, ACT)


@ct.function
def _norm_pair_dots(
    X,
    NW,
    WA,
    WB,
    bm,
    bna,
    bnb,
    eps,
    TM: ConstInt,
    TN: ConstInt,
    TK: ConstInt,
    LATENCY: ConstInt,
    OFFSET: ConstBool,
    PDL: ConstBool,
    NORM: ConstBool,
):
    """fp32 (TM, TN) RMSNorm(X) @ WA[bna tile]^T and RMSNorm(X) @ WB[bnb tile]^T: one X tile a K
    step for both, both weights' first tiles loaded before the PDL wait, the products reduced
    every K step, the row's rsqrt applied once at the end (NORM False: X's own products, NW
    unread)."""
    k_tiles = ct.num_tiles(WA, axis=1, shape=(TN, TK))
    wa = _gemv_w(WA, bna, 0, TN, TK, LATENCY)
    wb = _gemv_w(WB, bnb, 0, TN, TK, LATENCY)
    if PDL:
        ct.grid_dependency_control_wait()
    x, xw = _gemv_maybe_normed_x(X, NW, bm, 0, TM, TK, OFFSET, NORM)
    sq = x * x
    a = ct.sum(_gemv_scaled(xw, wa, TM, TN, TK), axis=2)
    b = ct.sum(_gemv_scaled(xw, wb, TM, TN, TK), axis=2)
    for k in range(1, k_tiles):
        wa = _gemv_w(WA, bna, k, TN, TK, LATENCY)
        wb = _gemv_w(WB, bnb, k, TN, TK, LATENCY)
        x, xw = _gemv_maybe_normed_x(X, NW, bm, k, TM, TK, OFFSET, NORM)
        sq = sq + x * x
        a = a + ct.sum(_gemv_scaled(xw, wa, TM, TN, TK), axis=2)
        b = b + ct.sum(_gemv_scaled(xw, wb, TM, TN, TK), axis=2)
    if NORM:
        inv = ct.rsqrt(ct.sum(sq, axis=1, keepdims=True) / X.shape[1] + eps)
        a = a * inv
        b = b * inv
    return a, b


@ct.kernel
def tilegym_norm_rope_gemv_kernel(
    X,
    NW,
    W,
    B,
    COS,
    SIN,
    QW,
    KW,
    WS,
    CNT,
    Y,
    Y3,
    KC,
    VC,
    POS,
    LEN,
    eps: float,
    head_eps: float,
    rot_heads: int,
    q_heads: int,
    HALF: ConstInt,
    TM: ConstInt,
    TN: ConstInt,
    TK: ConstInt,
    LATENCY: ConstInt,
    HAS_BIAS: ConstBool,
    OFFSET: ConstBool,
    HEAD_NORM: ConstBool,
    HEAD_OFFSET: ConstBool,
    KV_WRITE: ConstBool,
    NORM: ConstBool,
    WHOLE: ConstBool,
    PDL: ConstBool,
):
    """Y = RMSNorm(X) @ W^T (+ B) for a packed [q; k; v] weight of heads ``2 * HALF`` wide, with
    RoPE on the first ``rot_heads`` heads' outputs (q's and k's), and with HEAD_NORM each of
    those heads RMS-normed first (Qwen3's per-head q_norm / k_norm, weights QW for the first
    ``q_heads`` heads and KW after, ``[1, 2 * HALF]``; HEAD_OFFSET: ``1 + weight``): the
    layer's input norm, QKV GEMV, q/k norms and RoPE in one launch at decode. NORM False: no
    input norm (NW unread; a post-norm layer's QKV GEMV reads the residual stream itself).
    WHOLE (with HEAD_NORM): OLMo's q/k norms, each over the whole q (or k) projection, weights
    ``[heads, 2 * HALF]``; ``Y3`` is Y viewed ``[M, heads, 2 * HALF]``.

    A block computes ``TN`` outputs of one head's first half and the ``TN`` outputs ``HALF``
    further on, the pairs ``rotate_half`` mixes, then rotates them in fp32 with the row's COS
    and SIN (``[M, 2 * HALF]``): ``(a, b) -> (a cos1 - b sin1, b cos2 + a sin2)``, as
    ``x * cos + rotate_half(x) * sin``. A head's norm needs all of its outputs, which span
    ``HALF / TN`` blocks: with HEAD_NORM each block stores its fp32 outputs in WS (``[M,
    rot_heads, 2 * HALF]``, plain stores) and counts in on the head's counter in CNT; the last
    of them to arrive reads the whole head back, norms, rotates and stores it, and resets the
    counter (the split-K GEMM's last-CTA pattern). Rounded once, where upstream rounds the
    projection (and the norm) before rotating. The launcher runs it at TM 1 only.

    With KV_WRITE the rounded keys (heads ``q_heads`` to ``rot_heads``, rotated) and values
    (the heads after) also go to slot ``POS[0]`` of the static caches KC / VC (``[rows, kv
    heads, capacity, 2 * HALF]``, row ``bm`` a batch row), and block (0, 0) sets ``LEN[0] =
    POS[0] + 1``: `kv_cache_write_at`'s launch folded into this one.

    With WHOLE the counters are one a row and projection (q, then k): the last of the q
    projection's ``q_heads * HALF / TN`` blocks norms, rotates and stores all q heads
    (`_whole_norm_rope`), the last of k's all k heads (and writes them to the cache)."""
    chunks = HALF // TN
    h = ct.bid(0) // chunks
    j = ct.bid(0) % chunks
    bm = ct.bid(1)
    bna = h * 2 * chunks + j
    bnb = bna + chunks
    a, b = _norm_pair_dots(X, NW, W, W, bm, bna, bnb, eps, TM, TN, TK, LATENCY, OFFSET, PDL, NORM)
    if HAS_BIAS:
        a = a + ct.load(B, (bna,), (TN,), padding_mode=_ZERO, allow_tma=False).astype(
            ct.float32
        ).reshape((1, TN))
        b = b + ct.load(B, (bnb,), (TN,), padding_mode=_ZERO, allow_tma=False).astype(
            ct.float32
        ).reshape((1, TN))
    if h >= rot_heads:
        v_lo, v_hi = ct.astype(a, Y.dtype), ct.astype(b, Y.dtype)
        ct.store(Y, index=(bm, bna), tile=v_lo)
        ct.store(Y, index=(bm, bnb), tile=v_hi)
        if KV_WRITE:
            _cache_halves(VC, POS, v_lo, v_hi, bm, h - rot_heads, j, chunks)
    elif HEAD_NORM and WHOLE:
        ct.store(WS, index=(bm, h, j), tile=a.reshape((1, 1, TN)), allow_tma=False)
        ct.store(WS, index=(bm, h, j + chunks), tile=b.reshape((1, 1, TN)), allow_tma=False)
        kk = h // q_heads  # 0: a q head, 1: a k head (the launcher checks rot_heads <= 2 q_heads)
        h0 = kk * q_heads
        nh = q_heads + kk * (rot_heads - 2 * q_heads)
        slot = bm * 2 + kk
        if ct.atomic_add(CNT, slot, 1) == nh * chunks - 1:
            _whole_norm_rope(
                WS, COS, SIN, QW, KW, Y3, KC, POS, bm, h0, nh, kk, head_eps, HALF, KV_WRITE
            )
            ct.atomic_xchg(CNT, slot, 0)
    elif HEAD_NORM:
        ct.store(WS, index=(bm, h, j), tile=a.reshape((1, 1, TN)), allow_tma=False)
        ct.store(WS, index=(bm, h, j + chunks), tile=b.reshape((1, 1, TN)), allow_tma=False)
        slot = bm * rot_heads + h
        if ct.atomic_add(CNT, slot, 1) == chunks - 1:
            n_lo, n_hi = _head_norm_rope(
                WS, COS, SIN, QW, KW, Y, bm, h, head_eps, q_heads, HALF, HEAD_OFFSET
            )
            if KV_WRITE and h >= q_heads:
                _cache_halves(KC, POS, n_lo, n_hi, bm, h - q_heads, 0, 1)
            ct.atomic_xchg(CNT, slot, 0)
    else:
        c1 = ct.load(COS, (bm, j), (TM, TN), padding_mode=_ZERO, allow_tma=False).astype(ct.float32)
        c2 = ct.load(COS, (bm, j + chunks), (TM, TN), padding_mode=_ZERO, allow_tma=False).astype(
            ct.float32
        )
        s1 = ct.load(SIN, (bm, j), (TM, TN), padding_mode=_ZERO, allow_tma=False).astype(ct.float32)
        s2 = ct.load(SIN, (bm, j + chunks), (TM, TN), padding_mode=_ZERO, allow_tma=False).astype(
            ct.float32
        )
        r_lo = ct.astype(a * c1 - b * s1, Y.dtype)
        r_hi = ct.astype(b * c2 + a * s2, Y.dtype)
        ct.store(Y, index=(bm, bna), tile=r_lo)
        ct.store(Y, index=(bm, bnb), tile=r_hi)
        if KV_WRITE and h >= q_heads:
            _cache_halves(KC, POS, r_lo, r_hi, bm, h - q_heads, j, chunks)
    if KV_WRITE:
        end = (ct.gather(POS, 0) + 1).astype(LEN.dtype)
        ct.scatter(LEN, 0, end, mask=(ct.bid(0) + ct.bid(1)) == 0)


@ct.function
def _cache_halves(C, POS, lo, hi, bm, head, j, chunks):
    """Row ``bm``'s (1, n) tiles ``lo`` / ``hi`` into cache head ``head`` at slot ``POS[0]``,
    as tiles ``j`` and ``j + chunks`` of its width."""
    n = lo.shape[1]
    pos = ct.gather(POS, 0)
    row = C.slice(axis=2, start=pos, stop=pos + 1)
    ct.store(row, index=(bm, head, 0, j), tile=lo.reshape((1, 1, 1, n)), allow_tma=False)
    ct.store(row, index=(bm, head, 0, j + chunks), tile=hi.reshape((1, 1, 1, n)), allow_tma=False)


@ct.function
def _head_norm_rope(
    WS, COS, SIN, QW, KW, Y, bm, h, head_eps, q_heads, HALF: ConstInt, OFFSET: ConstBool
):
    """Row ``bm``'s head ``h`` from WS (fp32, both halves): RMS-normed with QW (q heads) or KW,
    rotated with the row's COS / SIN, stored to Y's head ``h``; returns the stored halves."""
    lo = ct.load(WS, (bm, h, 0), (1, 1, HALF), allow_tma=False).reshape((1, HALF))
    hi = ct.load(WS, (bm, h, 1), (1, 1, HALF), allow_tma=False).reshape((1, HALF))
    inv = ct.rsqrt((ct.sum(lo * lo) + ct.sum(hi * hi)) / (2 * HALF) + head_eps)
    if h < q_heads:
        w_lo = ct.load(QW, (0, 0), (1, HALF), allow_tma=False).astype(ct.float32)
        w_hi = ct.load(QW, (0, 1), (1, HALF), allow_tma=False).astype(ct.float32)
    else:
        w_lo = ct.load(KW, (0, 0), (1, HALF), allow_tma=False).astype(ct.float32)
        w_hi = ct.load(KW, (0, 1), (1, HALF), allow_tma=False).astype(ct.float32)
    if OFFSET:
        w_lo = w_lo + 1.0
        w_hi = w_hi + 1.0
    n_lo = lo * inv * w_lo
    n_hi = hi * inv * w_hi
    c1 = ct.load(COS, (bm, 0), (1, HALF), allow_tma=False).astype(ct.float32)
    c2 = ct.load(COS, (bm, 1), (1, HALF), allow_tma=False).astype(ct.float32)
    s1 = ct.load(SIN, (bm, 0), (1, HALF), allow_tma=False).astype(ct.float32)
    s2 = ct.load(SIN, (bm, 1), (1, HALF), allow_tma=False).astype(ct.float32)
    lo = ct.astype(n_lo * c1 - n_hi * s1, Y.dtype)
    hi = ct.astype(n_hi * c2 + n_lo * s2, Y.dtype)
    ct.store(Y, index=(bm, 2 * h), tile=lo)
    ct.store(Y, index=(bm, 2 * h + 1), tile=hi)
    return lo, hi


#: heads a step of `_whole_norm_rope` holds: at head dim 128 and 8 blocks an SM, sm_90 ptxas
#: fits 4 (two (1, 4, 64) fp32 halves) in 60-61 registers without spills; 8 spilled 64-160 bytes
WHOLE_NORM_HEADS = 4


@ct.function
def _whole_heads(A, h0, nh):
    """Heads ``h0 .. h0 + nh`` of A's axis 1 (one projection's heads of WS, Y3, a weight)."""
    return A.slice(axis=1, start=h0, stop=h0 + nh)


@ct.function
def _whole_norm_rope(
    WS, COS, SIN, QW, KW, Y3, KC, POS, bm, h0, nh, kk, head_eps, HALF: ConstInt, KV: ConstBool
):
    """Row ``bm``'s heads ``h0 .. h0 + nh`` (its whole q or k projection) from WS (fp32): RMS-
    normed together over all ``nh * 2 * HALF`` values with the ``[nh, 2 * HALF]`` weight (QW,
    or KW where ``kk`` is 1), rotated with the row's COS / SIN, stored to Y3 (and with KV, k's to
    the cache KC at ``POS[0]``). ``WHOLE_NORM_HEADS`` heads a step: one pass sums the squares,
    a second norms, rotates and stores."""
    HB = WHOLE_NORM_HEADS
    ws = _whole_heads(WS, h0, nh)
    steps = ct.cdiv(nh, HB)
    ss = ct.full((1, HB, 1), 0.0, dtype=ct.float32)
    for t in range(steps):
        lo = ct.load(ws, (bm, t, 0), (1, HB, HALF), padding_mode=_ZERO, allow_tma=False)
        hi = ct.load(ws, (bm, t, 1), (1, HB, HALF), padding_mode=_ZERO, allow_tma=False)
        ss = ss + ct.sum(lo * lo, axis=2, keepdims=True) + ct.sum(hi * hi, axis=2, keepdims=True)
    inv = ct.rsqrt(ct.sum(ss) / (nh * 2 * HALF) + head_eps)
    c1 = ct.load(COS, (bm, 0), (1, HALF), allow_tma=False).astype(ct.float32).reshape((1, 1, HALF))
    c2 = ct.load(COS, (bm, 1), (1, HALF), allow_tma=False).astype(ct.float32).reshape((1, 1, HALF))
    s1 = ct.load(SIN, (bm, 0), (1, HALF), allow_tma=False).astype(ct.float32).reshape((1, 1, HALF))
    s2 = ct.load(SIN, (bm, 1), (1, HALF), allow_tma=False).astype(ct.float32).reshape((1, 1, HALF))
    y = _whole_heads(Y3, h0, nh)
    pos = ct.gather(POS, 0)
    for t in range(steps):
        lo = ct.load(ws, (bm, t, 0), (1, HB, HALF), padding_mode=_ZERO, allow_tma=False)
        hi = ct.load(ws, (bm, t, 1), (1, HB, HALF), padding_mode=_ZERO, allow_tma=False)
        if kk == 1:
            w_lo = ct.load(KW, (t, 0), (HB, HALF), padding_mode=_ZERO, allow_tma=False)
            w_hi = ct.load(KW, (t, 1), (HB, HALF), padding_mode=_ZERO, allow_tma=False)
        else:
            w_lo = ct.load(QW, (t, 0), (HB, HALF), padding_mode=_ZERO, allow_tma=False)
            w_hi = ct.load(QW, (t, 1), (HB, HALF), padding_mode=_ZERO, allow_tma=False)
        n_lo = lo * inv * w_lo.astype(ct.float32).reshape((1, HB, HALF))
        n_hi = hi * inv * w_hi.astype(ct.float32).reshape((1, HB, HALF))
        r_lo = ct.astype(n_lo * c1 - n_hi * s1, Y3.dtype)
        r_hi = ct.astype(n_hi * c2 + n_lo * s2, Y3.dtype)
        ct.store(y, index=(bm, t, 0), tile=r_lo, allow_tma=False)
        ct.store(y, index=(bm, t, 1), tile=r_hi, allow_tma=False)
        if KV:
            _cache_whole_heads(KC, pos, r_lo, r_hi, bm, t, kk)


@ct.function
def _cache_whole_heads(KC, pos, lo, hi, bm, t, kk):
    """Step ``t``'s (1, heads, n) halves into cache slot ``pos`` of row ``bm``, if they are k's
    (``kk`` 1): `_cache_halves` for a group of heads."""
    if kk == 1:
        hb, n = lo.shape[1], lo.shape[2]
        row = KC.slice(axis=2, start=pos, stop=pos + 1)
        ct.store(row, index=(bm, t, 0, 0), tile=lo.reshape((1, hb, 1, n)), allow_tma=False)
        ct.store(row, index=(bm, t, 0, 1), tile=hi.reshape((1, hb, 1, n)), allow_tma=False)


@ct.kernel
def tilegym_gate_up_gemv_kernel(
    X,
    WG,
    WU,
    Y,
    TM: ConstInt,
    TN: ConstInt,
    TK: ConstInt,
    LATENCY: ConstInt,
    ACT: ConstInt,
    PDL: ConstBool,
):
    """Y = act(X @ WG^T) * (X @ WU^T) for a few rows: `tilegym_gate_up_silu_kernel` as a GEMV
    (plain loads and multiply-adds, both weights' first tiles loaded before the PDL wait, one X
    tile a K step for both, the products reduced every step)."""
    bn = ct.bid(0)
    bm = ct.bid(1)
    wg = _gemv_w(WG, bn, 0, TN, TK, LATENCY)
    wu = _gemv_w(WU, bn, 0, TN, TK, LATENCY)
    if PDL:
        ct.grid_dependency_control_wait()
    x = _gemv_x(X, bm, 0, TM, TK)
    gate = ct.sum(_gemv_scaled(x, wg, TM, TN, TK), axis=2)
    up = ct.sum(_gemv_scaled(x, wu, TM, TN, TK), axis=2)
    for k in range(1, ct.num_tiles(WG, axis=1, shape=(TN, TK))):
        wg = _gemv_w(WG, bn, k, TN, TK, LATENCY)
        wu = _gemv_w(WU, bn, k, TN, TK, LATENCY)
        x = _gemv_x(X, bm, k, TM, TK)
        gate = gate + ct.sum(_gemv_scaled(x, wg, TM, TN, TK), axis=2)
        up = up + ct.sum(_gemv_scaled(x, wu, TM, TN, TK), axis=2)
    _act_mul_store(gate, up, Y, bm, bn, ACT)


@ct.function
def _gemv_x(X, bm, k, TM: ConstInt, TK: ConstInt):
    """fp32 (TM, TK) X tile of K step ``k``."""
    return ct.load(X, (bm, k), (TM, TK), padding_mode=_ZERO, allow_tma=False).astype(ct.float32)


@ct.function
def _gemv_normed_x(X, NW, bm, k, TM: ConstInt, TK: ConstInt, OFFSET: ConstBool):
    """fp32 (X tile, X tile times the norm weight) of K step ``k``."""
    x = _gemv_x(X, bm, k, TM, TK)
    nw = ct.load(NW, (k,), (TK,), padding_mode=_ZERO, allow_tma=False).astype(ct.float32)
    if OFFSET:
        nw = nw + 1.0
    return x, x * nw.reshape((1, TK))


@ct.function
def _gemv_maybe_normed_x(
    X, NW, bm, k, TM: ConstInt, TK: ConstInt, OFFSET: ConstBool, NORM: ConstBool
):
    """`_gemv_normed_x`, or (NORM False) the X tile twice: a GEMV without the input norm."""
    if NORM:
        x, xw = _gemv_normed_x(X, NW, bm, k, TM, TK, OFFSET)
    else:
        x = _gemv_x(X, bm, k, TM, TK)
        xw = x
    return x, xw


@ct.function
def _gemv_scaled(xw, w, TM: ConstInt, TN: ConstInt, TK: ConstInt):
    """fp32 (TM, TN, TK) products of fp32 X rows (normed or not) with a W tile."""
    return xw.reshape((TM, 1, TK)) * w.astype(ct.float32).reshape((1, TN, TK))


def _act_mul_store(gate, up, y, bm, bn, ACT: ConstInt):
    """Y tile = act(gate) * up from the fp32 accumulators, rounded once."""
    if ACT == ACT_GELU_TANH:
        ct.store(y, index=(bm, bn), tile=ct.astype(gelu_tanh(gate) * up, y.dtype))
    else:
        act = gate / (1.0 + ct.exp(-gate))
        ct.store(y, index=(bm, bn), tile=ct.astype(act * up, y.dtype))


@ct.kernel
def tilegym_gate_up_silu_kernel(
    X,
    WG,
    WU,
    Y,
    WS,
    CNT,
    split: int,
    TM: ConstInt,
    TN: ConstInt,
    TK: ConstInt,
    GROUP_M: ConstInt,
    LATENCY: ConstInt,
    TRANSPOSE_TILE: ConstBool,
    SPLIT_MODE: ConstInt,
    SWAP: ConstBool,
    STAGGER: ConstBool,
    ACT: ConstInt,
    PDL: ConstBool,
):
    """Y[M, I] = silu(X @ WG^T) * (X @ WU^T) (ACT_GELU_TANH: gelu_tanh instead of silu); WS
    holds gate partials at [0, split), up after. PDL as `tilegym_linear_kernel`'s."""
    m = X.shape[0]
    n = WG.shape[0]
    bm, bn = _tile_coords(m, n, TM, TN, GROUP_M)
    s = ct.bid(1)
    k_tiles = ct.num_tiles(X, axis=1, shape=(TM, TK))
    k_first, k_last = _k_share(k_tiles, split, s)
    gate = _acc_zeros(TM, TN, SWAP)
    up = _acc_zeros(TM, TN, SWAP)
    _mma_pdl_start(PDL)
    for k0 in range(k_first, k_last):
        k = _k_tile(k0, k_first, k_last, bn, STAGGER)
        # one X tile feeds both mmas (two loads of it were two TMA copies per K step)
        xop = _x_operand(X, bm, k, TM, TK, LATENCY, TRANSPOSE_TILE, SWAP)
        gate = _mma_with(xop, WG, gate, bn, k, TN, TK, LATENCY, TRANSPOSE_TILE, SWAP)
        up = _mma_with(xop, WU, up, bn, k, TN, TK, LATENCY, TRANSPOSE_TILE, SWAP)
    gate = _acc_out(gate, SWAP)
    up = _acc_out(up, SWAP)
    if SPLIT_MODE == NO_SPLIT:
        _act_mul_store(gate, up, Y, bm, bn, ACT)
    elif SPLIT_MODE == SPLIT_PARTIAL:
        _store_partial(WS, (s, bm, bn), gate, TM, TN)
        _store_partial(WS, (split + s, bm, bn), up, TM, TN)
    else:
        _store_partial(WS, (s, bm, bn), gate, TM, TN)
        _store_partial(WS, (split + s, bm, bn), up, TM, TN)
        tile_id = bm * ct.cdiv(n, TN) + bn
        arrived = ct.atomic_add(CNT, tile_id, 1)
        if arrived == split - 1:
            gate_sum = _sum_partials(WS, 0, split, bm, bn, TM, TN)
            up_sum = _sum_partials(WS, split, split, bm, bn, TM, TN)
            _act_mul_store(gate_sum, up_sum, Y, bm, bn, ACT)
            ct.atomic_xchg(CNT, tile_id, 0)


@ct.kernel
def tilegym_splitk_reduce_kernel(
    WS,
    B,
    R,
    Y,
    split: int,
    TM: ConstInt,
    TN: ConstInt,
    HAS_BIAS: ConstBool,
    HAS_RES: ConstBool,
    GATED: ConstBool,
    ACT: ConstInt,
):
    """Sum the split-K partials of one output tile and apply the epilogue (GATED: ``ACT`` of
    the gate times up); grid (tiles,).

    Launched as a programmatic dependent of the split kernel: its blocks wait here until the
    split kernel's partials are visible.
    """
    n = Y.shape[1]
    num_n = ct.cdiv(n, TN)
    bm = ct.bid(0) // num_n
    bn = ct.bid(0) % num_n
    ct.grid_dependency_control_wait()
    if GATED:
        gate = _sum_partials(WS, 0, split, bm, bn, TM, TN)
        up = _sum_partials(WS, split, split, bm, bn, TM, TN)
        _act_mul_store(gate, up, Y, bm, bn, ACT)
    else:
        total = _sum_partials(WS, 0, split, bm, bn, TM, TN)
        _linear_epilogue(total, B, R, Y, bm, bn, TM, TN, HAS_BIAS, HAS_RES)


class _DeviceBuffers:
    """Per-device split-K workspace (grown on demand) and zeroed tile counters.

    The counters are reset by the kernels themselves, so they stay zero between launches.
    Inside ``private_buffers()`` (the compiled path) every call gets its own tensors instead.
    """

    def __init__(self) -> None:
        self._ws: dict[torch.device, torch.Tensor] = {}
        self._cnt: dict[torch.device, torch.Tensor] = {}
        self._dummy: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def workspace(self, device: torch.device, numel: int) -> torch.Tensor:
        if buffers_private():
            return torch.empty(max(numel, 1), dtype=torch.float32, device=device)
        ws = self._ws.get(device)
        if ws is None or ws.numel() < numel:
            ws = torch.empty(max(numel, 1 << 20), dtype=torch.float32, device=device)
            self._ws[device] = ws
        return ws

    def counters(self, device: torch.device, tiles: int) -> torch.Tensor:
        """Zeroed counters for ``tiles`` output tiles (the shared ones hold ``_COUNTER_SLOTS``)."""
        if buffers_private():
            return torch.zeros(max(1, min(tiles, _COUNTER_SLOTS)), dtype=torch.int32, device=device)
        cnt = self._cnt.get(device)
        if cnt is None:
            cnt = torch.zeros(_COUNTER_SLOTS, dtype=torch.int32, device=device)
            self._cnt[device] = cnt
        return cnt

    def kept_counters(self, device: torch.device, tiles: int) -> torch.Tensor:
        """`counters`, but the process-wide ones even inside ``private_buffers()`` once
        `reserve_counters` has made them: they never grow or move, and every kernel leaves them
        at zero, so a captured graph may keep their address, and it then has no fill node for
        fresh ones (one memset launch a call, outside cuTile)."""
        cnt = self._cnt.get(device)
        if cnt is not None and tiles <= cnt.numel():
            return cnt
        return self.counters(device, tiles)

    def reserve_counters(self, device: torch.device) -> None:
        """Make the process-wide counters now (eager code, outside any graph capture)."""
        if device not in self._cnt:
            self._cnt[device] = torch.zeros(_COUNTER_SLOTS, dtype=torch.int32, device=device)

    def placeholders(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """A workspace and counters of an unsplit launch (never read): no allocation, or in
        ``private_buffers()`` an uninitialized one (a captured graph then has no fill for it)."""
        if buffers_private():
            return torch.empty((1, 1, 1), dtype=torch.float32, device=device), torch.empty(
                1, dtype=torch.int32, device=device
            )
        return self.workspace(device, 1).view(-1)[:1].view(1, 1, 1), self.counters(device, 1)

    def dummies(
        self, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A 1-D and a 2-D placeholder for absent bias / residual (never read)."""
        if buffers_private():
            return torch.empty(16, dtype=dtype, device=device), torch.empty(
                16, 16, dtype=dtype, device=device
            )
        key = (device, dtype)
        if key not in self._dummy:
            self._dummy[key] = (
                torch.zeros(16, dtype=dtype, device=device),
                torch.zeros(16, 16, dtype=dtype, device=device),
            )
        return self._dummy[key]


_BUFFERS = _DeviceBuffers()


def reserve_counters(device: torch.device) -> None:
    """Make the process-wide tile counters on ``device`` now, from eager code: the compiled
    path's per-head norms in `rms_norm_linear_rope` then use them instead of zeroing fresh ones
    every call (`_DeviceBuffers.kept_counters`)."""
    _BUFFERS.reserve_counters(device)


def _as_2d(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1 or (x2.shape[0] > 1 and x2.stride(0) != x2.shape[1]):
        x2 = x2.contiguous()
    return x2


_DTYPES = (torch.bfloat16, torch.float16)


def _check(x: torch.Tensor, weight: torch.Tensor, k: int) -> None:
    """One clear ValueError for inputs the kernels do not take (instead of a launch failure)."""
    if not (x.is_cuda and weight.is_cuda):
        raise ValueError(f"x and weight must be CUDA tensors, got {x.device} and {weight.device}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"dtype {x.dtype} is not supported (bfloat16, float16)")
    if weight.dim() != 2 or weight.shape[1] != k:
        raise ValueError(f"weight shape {tuple(weight.shape)} does not match K={k}")
    if x.dtype != weight.dtype:
        raise ValueError(f"x dtype {x.dtype} differs from weight dtype {weight.dtype}")
    if weight.stride(1) != 1:
        raise ValueError("weight must be contiguous along K")


def hinted(kernel, cfg: TileConfig, blocks: int):
    """`kernel` compiled with the config's cluster/occupancy hints (`with_hints`, cached).

    A cluster needs a block count divisible by its size, so an uneven grid gets the plain
    kernel (same result, only the hint differs)."""
    ctas = cfg.ctas if cfg.ctas > 1 and blocks % cfg.ctas == 0 else 0
    if not (ctas or cfg.occupancy):
        return kernel
    return with_hints(kernel, num_ctas=ctas or None, occupancy=cfg.occupancy or None)


def split_mode(cfg: TileConfig) -> int:
    """The kernels' SPLIT_MODE constant for a configuration."""
    if cfg.split == 1:
        return NO_SPLIT
    return SPLIT_CTA if cfg.reduce == "cta" else SPLIT_PARTIAL


def _split_args(cfg: TileConfig, m: int, n: int, parts: int, device: torch.device):
    """(split, SPLIT_MODE, workspace [parts*split, M, N], counters) for one launch.

    An unsplit launch gets one-element placeholders; so does a "cta" split whose output has
    more tiles than there are counters (it runs unsplit)."""
    tiles = math.ceil(m / cfg.tm) * math.ceil(n / cfg.tn)
    mode = split_mode(cfg)
    if mode == NO_SPLIT or (mode == SPLIT_CTA and tiles > _COUNTER_SLOTS):
        ws, cnt = _BUFFERS.placeholders(device)
        return 1, NO_SPLIT, ws, cnt
    cnt = _BUFFERS.counters(device, tiles if mode == SPLIT_CTA else 1)
    numel = parts * cfg.split * m * n
    ws = _BUFFERS.workspace(device, numel)[:numel].view(parts * cfg.split, m, n)
    return cfg.split, mode, ws, cnt


def _launch_reduce(cfg, ws, split, bias, residual2, out2, gated: bool, act: int = ACT_SILU) -> None:
    """The dependent reduction of a `reduce="pdl"` split: one block per output tile."""
    m, n = out2.shape
    dummy_b, dummy_r = _BUFFERS.dummies(out2.device, out2.dtype)
    args = (
        ws,
        bias if bias is not None else dummy_b,
        residual2 if residual2 is not None else dummy_r,
        out2,
        split,
        cfg.tm,
        cfg.tn,
        bias is not None,
        residual2 is not None,
        gated,
        act,
    )
    grid = (math.ceil(m / cfg.tm) * math.ceil(n / cfg.tn), 1, 1)
    ct.launch(
        stream(out2.device),
        grid,
        tilegym_splitk_reduce_kernel,
        args,
        programmatic_dependent_launch=True,
    )


def _io_args(x2, weight, bias, residual2, out2) -> tuple:
    """The leading X, W, B, R, Y arguments of the linear kernels (placeholders for an absent
    bias or residual)."""
    dummy_b, dummy_r = _BUFFERS.dummies(x2.device, x2.dtype)
    return (
        x2,
        weight,
        bias if bias is not None else dummy_b,
        residual2 if residual2 is not None else dummy_r,
        out2,
    )


def _launch_persistent(x2, weight, bias, residual2, out2, cfg: TileConfig) -> None:
    m, _ = x2.shape
    n = weight.shape[0]
    tiles = math.ceil(m / cfg.tm) * math.ceil(n / cfg.tn)
    blocks = min(tiles, sm_count(x2.device) * max(cfg.occupancy, 1))
    args = (
        *_io_args(x2, weight, bias, residual2, out2),
        cfg.tm,
        cfg.tn,
        cfg.tk,
        cfg.group_m,
        cfg.latency,
        cfg.transpose_tile,
        bias is not None,
        residual2 is not None,
        cfg.swap,
        cfg.stagger,
    )
    kernel = hinted(tilegym_linear_persistent_kernel, cfg, blocks)
    ct.launch(stream(x2.device), (blocks, 1, 1), kernel, args)


#: id(weight) -> the weight's version counter when a GEMV last read it
_GEMV_READ: dict[int, int] = {}


def _pdl_ready(weight: torch.Tensor) -> bool:
    """Whether no kernel can be writing ``weight`` right before this GEMV: an earlier GEMV read
    this tensor at its current version. The first read of a tensor (a lazily built weight's
    builder may be the kernel just before) and the first after an in-place write (torch moves
    the version) are not; a kernel writing a weight behind torch's back is outside the rule.
    An inference tensor has no version counter, so it is never ready."""
    if weight.is_inference():
        return False
    key, version = id(weight), weight._version
    seen = _GEMV_READ.get(key)
    if seen is None:
        weakref.finalize(weight, _GEMV_READ.pop, key, None)
    _GEMV_READ[key] = version
    return seen == version


def _gemv_tiles(cfg: TileConfig) -> tuple[int, int, int, int]:
    """The (TM, TN, TK, LATENCY) constants of the GEMV kernels."""
    return cfg.tm, cfg.tn, cfg.tk, cfg.latency or GEMV_LATENCY


def _launch_rows(kernel, cfg: TileConfig, x2, n: int, args: tuple, pdl: bool) -> None:
    """One of the GEMV kernels over (N tiles, M tiles), hinted by its config."""
    grid = (math.ceil(n / cfg.tn), math.ceil(x2.shape[0] / cfg.tm), 1)
    hinted_kernel = hinted(kernel, cfg, grid[0])
    ct.launch(stream(x2.device), grid, hinted_kernel, args, programmatic_dependent_launch=pdl)


def _launch_gemv(x2, weight, bias, residual2, out2, cfg: TileConfig) -> None:
    """The GEMV kernel; with `GEMV_PDL` launched as a programmatic dependent where the weight
    is safe to load early (`_pdl_ready`)."""
    pdl = GEMV_PDL and _pdl_ready(weight)
    io = _io_args(x2, weight, bias, residual2, out2)
    args = (*io, *_gemv_tiles(cfg), bias is not None, residual2 is not None, pdl)
    _launch_rows(tilegym_gemv_kernel, cfg, x2, weight.shape[0], args, pdl)


def _launch_norm_gemv(x2, norm_weight, eps, weight, bias, out2, cfg, unit_offset) -> None:
    """The norm-prologue GEMV kernel, with PDL as `_launch_gemv` decides it."""
    pdl = GEMV_PDL and _pdl_ready(weight)
    b = bias if bias is not None else _BUFFERS.dummies(x2.device, x2.dtype)[0]
    args = (x2, norm_weight, weight, b, out2, float(eps), *_gemv_tiles(cfg))
    args += (bias is not None, bool(unit_offset), pdl)
    _launch_rows(tilegym_norm_gemv_kernel, cfg, x2, weight.shape[0], args, pdl)


def _launch_norm_gate_up(x2, norm_weight, eps, gate_up_weight, out2, cfg, act, offset) -> None:
    """The norm-prologue gate/up GEMV kernel, with PDL as `_launch_gemv` decides it."""
    i = gate_up_weight.shape[0] // 2
    pdl = GEMV_PDL and _pdl_ready(gate_up_weight)
    wg, wu = gate_up_weight[:i], gate_up_weight[i:]
    args = (x2, norm_weight, wg, wu, out2, float(eps), *_gemv_tiles(cfg), bool(offset), act, pdl)
    _launch_rows(tilegym_norm_gate_up_gemv_kernel, cfg, x2, i, args, pdl)


def _launch_gate_up_gemv(x2, gate_up_weight, out2, cfg: TileConfig, act: int) -> None:
    """The gate/up GEMV kernel, a programmatic dependent as `_launch_gemv`."""
    i = gate_up_weight.shape[0] // 2
    pdl = GEMV_PDL and _pdl_ready(gate_up_weight)
    weights = (gate_up_weight[:i], gate_up_weight[i:])
    args = (x2, *weights, out2, *_gemv_tiles(cfg), act, pdl)
    _launch_rows(tilegym_gate_up_gemv_kernel, cfg, x2, i, args, pdl)


def _launch_mma(kernel, cfg: TileConfig, grid, args: tuple, device) -> None:
    """One of the mma GEMM kernels, with the PDL code and launch `MMA_PDL` asks for at a
    decode tile (a prefill tile runs neither: it was not measured)."""
    if MMA_PDL not in MMA_PDL_MODES:
        raise ValueError(f"MMA_PDL {MMA_PDL!r} is none of {MMA_PDL_MODES}")
    mode = MMA_PDL if cfg.tm <= DECODE_MAX_M else "off"
    code, dependent = mode != "off", mode == "dependent"
    ct.launch(stream(device), grid, kernel, (*args, code), programmatic_dependent_launch=dependent)


def _launch_linear(x2, weight, bias, residual2, out2, cfg: TileConfig) -> None:
    if cfg.gemv:
        _launch_gemv(x2, weight, bias, residual2, out2, cfg)
        return
    if cfg.persistent and cfg.split == 1:
        _launch_persistent(x2, weight, bias, residual2, out2, cfg)
        return
    m, _ = x2.shape
    n = weight.shape[0]
    device = x2.device
    split, mode, ws, cnt = _split_args(cfg, m, n, 1, device)
    grid = (math.ceil(m / cfg.tm) * math.ceil(n / cfg.tn), split, 1)
    args = (
        *_io_args(x2, weight, bias, residual2, out2),
        ws,
        cnt,
        split,
        cfg.tm,
        cfg.tn,
        cfg.tk,
        cfg.group_m,
        cfg.latency,
        cfg.transpose_tile,
        mode,
        bias is not None,
        residual2 is not None,
        cfg.swap,
        cfg.stagger,
    )
    kernel = hinted(tilegym_linear_kernel, cfg, grid[0])
    _launch_mma(kernel, cfg, grid, args, device)
    if mode == SPLIT_PARTIAL:
        _launch_reduce(cfg, ws, split, bias, residual2, out2, gated=False)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    config: TileConfig | None = None,
) -> torch.Tensor:
    """`x[..., K] @ weight[N, K]^T (+ bias[N])` with fp32 accumulation; returns `[..., N]`.

    `out` (contiguous, `[..., N]`) receives the result when given; `config` overrides the
    tile table (the benchmark's sweep uses it).
    """
    k = x.shape[-1]
    _check(x, weight, k)
    n = weight.shape[0]
    x2 = _as_2d(x)
    m = x2.shape[0]
    if out is None:
        out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    cfg = config or choose_config(m, n, k)
    _launch_linear(x2, weight, bias, None, out.view(m, n), cfg)
    return out


def linear_residual(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    config: TileConfig | None = None,
) -> torch.Tensor:
    """`residual + x @ weight^T`, the add done in the GEMM epilogue (o_proj, down_proj)."""
    k = x.shape[-1]
    _check(x, weight, k)
    n = weight.shape[0]
    if residual.shape[-1] != n or residual.shape[:-1] != x.shape[:-1]:
        raise ValueError(f"residual shape {tuple(residual.shape)} does not match output")
    x2 = _as_2d(x)
    m = x2.shape[0]
    if out is None:
        out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    cfg = config or choose_config(m, n, k)
    _launch_linear(x2, weight, None, _as_2d(residual), out.view(m, n), cfg)
    return out


def _norm_weight(norm_weight: torch.Tensor, k: int) -> torch.Tensor:
    """A fused norm's weight, checked (one ValueError) and with unit stride."""
    if norm_weight.shape != (k,) or not norm_weight.is_cuda:
        raise ValueError(
            f"norm weight must be a CUDA tensor of shape ({k},), got "
            f"{tuple(norm_weight.shape)} on {norm_weight.device}"
        )
    return norm_weight if norm_weight.stride(0) == 1 else norm_weight.contiguous()


def rms_norm_linear(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    unit_offset: bool = False,
    out: torch.Tensor | None = None,
    config: TileConfig | None = None,
) -> torch.Tensor:
    """`linear(RMSNorm(x), weight, bias)`: a layer's input norm and its first projection.

    One row (decode at batch 1) is one launch of `tilegym_norm_gemv_kernel`, on the table's
    GEMV tile or, where the table picks an mma kernel for the plain GEMM, the default GEMV tile
    (the launch it saves is worth more than the mma's edge on a few-microsecond GEMM); more rows
    take the norm kernel, then the GEMM. `unit_offset`: Gemma's ``1 + weight`` norm."""
    k = x.shape[-1]
    _check(x, weight, k)
    norm_weight = _norm_weight(norm_weight, k)
    n = weight.shape[0]
    x2 = _as_2d(x)
    m = x2.shape[0]
    cfg = config or choose_config(m, n, k)
    if config is None and m == 1 and not cfg.gemv:  # the table's mma pick does not take the norm
        cfg = default_config("single", False)
    if not cfg.gemv or m == 0 or norm_weight.dtype != x.dtype:  # (a promoting norm: two steps)
        normed = _rms_norm.rms_norm(x, norm_weight, eps, unit_offset=unit_offset)
        return linear(normed, weight, bias, out=out, config=config)
    if out is None:
        out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    _launch_norm_gemv(x2, norm_weight, eps, weight, bias, out.view(m, n), cfg, unit_offset)
    return out


#: the norm + QKV + RoPE GEMV's tile: two accumulators a block (a head's two halves), as the
#: norm-prologue gate/up GEMV's, hinted to 8 blocks an SM: sm_90 ptxas gives 92-104 registers
#: (5 blocks) without the hint and 63-64 with it, per-head norms or not, no spills either way
#: (every load plain: a TMA load of the small norm weights made the compiler specialize warps,
#: 256 threads and spills under the hint). The same hint took the
#: norm-prologue gate/up GEMV from 28.9 to 26.6 us at llama's gate/up and 67.7 to 63.1 at
#: olmo3's on an H100 (`bench_gemv_stream.py` probe, 12-06)
NORM_ROPE_TILE = TileConfig(1, 2, 1024, gemv=True, occupancy=8)


@dataclass(frozen=True)
class HeadNorms:
    """Per-head q/k RMSNorms between the QKV projection and RoPE (Qwen3's ``q_norm`` /
    ``k_norm``): their ``[D]`` weights, eps, the number of q heads (k's follow), and Gemma's
    ``1 + weight`` form. ``whole``: OLMo's norms, each over the whole q (k) projection, weights
    ``[q heads * D]`` (``[k heads * D]``); ``round_once`` is how the CPU reference rounds them
    (OLMo 2/3's normed row times the weight rounded once, else Llama's norm), as
    ``qk_norm_whole_rope``'s ``round_once`` (the kernel rounds only its result)."""

    q_weight: torch.Tensor
    k_weight: torch.Tensor
    eps: float
    q_heads: int
    unit_offset: bool = False
    whole: bool = False
    round_once: bool = False


@dataclass(frozen=True)
class CacheWrite:
    """A static KV cache the norm + QKV + RoPE GEMV also writes the new token into: its rotated
    keys and its values go to slot ``position[0]`` (read on the device) of ``keys`` / ``values``
    (``[rows, kv heads, capacity, D]``), and ``length`` becomes ``position[0] + 1``, as
    `kv_cache.kv_cache_write_at` does in a launch of its own (transformers' ``StaticLayer``:
    ``keys``, ``values``, ``cumulative_length``). ``q_heads``: the q heads before the keys."""

    keys: torch.Tensor
    values: torch.Tensor
    position: torch.Tensor
    length: torch.Tensor
    q_heads: int


def _check_cache_write(cw: CacheWrite, x: torch.Tensor, m: int, n: int, d: int, rot: int):
    kv = rot - cw.q_heads
    want = (m, kv, d)
    for t in (cw.keys, cw.values):
        if t.dim() != 4 or (t.shape[0], t.shape[1], t.shape[3]) != want or t.dtype != x.dtype:
            raise ValueError(
                f"rms_norm_linear_rope: caches must be {x.dtype} [{m}, {kv}, capacity, {d}], "
                f"got {t.dtype} {tuple(t.shape)}"
            )
        if t.stride(3) != 1 or t.device != x.device:
            raise ValueError("rms_norm_linear_rope: caches must be on x's device, rows contiguous")
    if n // d != rot + kv:
        raise ValueError(
            f"rms_norm_linear_rope: {n // d} heads are not {cw.q_heads} q, {kv} k and {kv} v"
        )
    check_device_counters(cw.position, cw.length)


def _check_head_norms(heads: HeadNorms, dtype: torch.dtype, d: int, rot: int) -> None:
    if not 0 < heads.q_heads <= rot <= 2 * heads.q_heads:
        raise ValueError(f"rms_norm_linear_rope: {heads.q_heads} q heads of {rot} rotated")
    if heads.whole and heads.unit_offset:  # no model has it; the whole-projection pass omits it
        raise ValueError("rms_norm_linear_rope: whole-projection q/k norms have no 1 + weight form")
    widths = (heads.q_heads * d, (rot - heads.q_heads) * d) if heads.whole else (d, d)
    for w, width in zip((heads.q_weight, heads.k_weight), widths, strict=True):
        if w.shape != (width,) or w.dtype != dtype or w.stride(0) != 1:
            raise ValueError(
                f"rms_norm_linear_rope: head norm weights must be contiguous ({width},) "
                f"{dtype}, got {tuple(w.shape)} {w.dtype}"
            )


def _launch_norm_rope(x2, norm_weight, eps, weight, bias, tables, rot, out2, cfg, offset, extra):
    """The norm + QKV + RoPE GEMV kernel (with ``heads``, the q/k norms too; with ``cache``,
    the KV-cache write; without ``norm_weight``, no input norm), with PDL as `_launch_gemv`
    decides it."""
    heads, cache = extra
    cos2, sin2 = tables
    m, d = cos2.shape
    pdl = GEMV_PDL and _pdl_ready(weight)
    b = bias if bias is not None else _BUFFERS.dummies(x2.device, x2.dtype)[0]
    nw = norm_weight if norm_weight is not None else b
    q_heads = cache.q_heads if cache is not None else 0
    whole = heads is not None and heads.whole
    if heads is None:
        ws, cnt = _BUFFERS.placeholders(x2.device)
        qw = kw = b.view(1, -1)
        head_eps = 0.0
    else:
        ws = _BUFFERS.workspace(x2.device, m * rot * d)[: m * rot * d].view(m, rot, d)
        cnt = _BUFFERS.kept_counters(x2.device, m * (2 if whole else rot))
        qw, kw = heads.q_weight.view(-1, d), heads.k_weight.view(-1, d)
        head_eps, q_heads = heads.eps, heads.q_heads
    if cache is None:
        kc = vc = b.view(1, 1, 1, -1)
        pos = length = cnt.view(-1)[:1]
    else:
        kc, vc, pos, length = cache.keys, cache.values, cache.position, cache.length.view(1)
    y3 = out2.view(m, -1, d)
    args = (x2, nw, weight, b, cos2, sin2, qw, kw, ws, cnt, out2, y3, kc, vc, pos, length)
    args += (float(eps), float(head_eps), int(rot), int(q_heads), d // 2, *_gemv_tiles(cfg))
    args += (bias is not None, bool(offset), heads is not None)
    args += (bool(heads is not None and heads.unit_offset), cache is not None)
    args += (norm_weight is not None, whole, pdl)
    grid = (weight.shape[0] // (2 * cfg.tn), math.ceil(x2.shape[0] / cfg.tm), 1)
    kernel = hinted(tilegym_norm_rope_gemv_kernel, cfg, grid[0])
    ct.launch(stream(x2.device), grid, kernel, args, programmatic_dependent_launch=pdl)


def rms_norm_linear_rope(
    x: torch.Tensor,
    norm_weight: torch.Tensor | None,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rotated_heads: int,
    *,
    unit_offset: bool = False,
    head_norms: HeadNorms | None = None,
    cache: CacheWrite | None = None,
    out: torch.Tensor | None = None,
    config: TileConfig | None = None,
) -> torch.Tensor:
    """`linear(RMSNorm(x), weight, bias)` of a packed [q; k; v] projection whose heads are
    ``D = cos.shape[-1]`` wide, with RoPE (``x * cos + rotate_half(x) * sin``) on its first
    ``rotated_heads`` heads (q's and k's), each RMS-normed first with ``head_norms``: a layer's
    input norm, QKV projection, q/k norms and RoPE in one launch of
    `tilegym_norm_rope_gemv_kernel`. ``cos``/``sin``: one ``[D]`` row per row of x (``[...,
    D]``, as a rotary module returns them). With ``cache`` the new keys and values also go
    into a static KV cache (`CacheWrite`; row r of x is the cache's batch row r). Without
    ``norm_weight`` there is no input norm: ``linear(x, weight, bias)`` (OLMo's post-norm
    layers). Meant for decode (a few rows): every row is a GEMV
    (`NORM_ROPE_TILE` unless ``config``, one row a block: two rows a block with 8-row tiles
    faulted with a misaligned address on an H100, 12-06, cause not found)."""
    k = x.shape[-1]
    _check(x, weight, k)
    if norm_weight is not None:
        norm_weight = _norm_weight(norm_weight, k)
    n, d = weight.shape[0], cos.shape[-1]
    x2 = _as_2d(x)
    m = x2.shape[0]
    cfg = config or NORM_ROPE_TILE
    if not cfg.gemv or cfg.tm != 1 or d % (2 * cfg.tn) or n % d:
        raise ValueError(
            f"rms_norm_linear_rope: heads of {d} (cos's width) must split into two halves of "
            f"{cfg.tn}-row GEMV tiles and divide the {n} output rows, one row a block (tile "
            f"{cfg.tm}x{cfg.tn}x{cfg.tk})"
        )
    if sin.shape != cos.shape or cos.numel() != m * d or not 0 <= rotated_heads <= n // d:
        raise ValueError(
            f"rms_norm_linear_rope: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must be one "
            f"[{d}] row per row of x ({m}); rotated heads {rotated_heads} of {n // d}"
        )
    if norm_weight is not None and norm_weight.dtype != x.dtype:
        raise ValueError(f"rms_norm_linear_rope: norm weight {norm_weight.dtype}, x {x.dtype}")
    if head_norms is not None:
        _check_head_norms(head_norms, x.dtype, d, rotated_heads)
    if cache is not None:
        _check_cache_write(cache, x, m, n, d, rotated_heads)
        if head_norms is not None and head_norms.q_heads != cache.q_heads:
            raise ValueError(
                f"rms_norm_linear_rope: {head_norms.q_heads} q heads to norm, "
                f"{cache.q_heads} before the cached keys"
            )
    if out is None:
        out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    tables = cos.reshape(m, d).contiguous(), sin.reshape(m, d).contiguous()
    args = (x2, norm_weight, eps, weight, bias, tables, rotated_heads, out.view(m, n), cfg)
    _launch_norm_rope(*args, unit_offset, (head_norms, cache))
    return out


#: the norm-prologue gate/up GEMV's tile at one row: both weights' products fit the
#: keep-products budget of `GEMV_ACC_ELEMS` at 2 x 1 x 2 x 1024 (reduced every step here)
NORM_GATE_UP_TILE = TileConfig(1, 2, 1024, gemv=True)
#: the plain gate/up GEMV's tile the AOT gate compiles (the table picks its own)
GATE_UP_GEMV_TILE = NORM_GATE_UP_TILE


def rms_norm_gate_up(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    gate_up_weight: torch.Tensor,
    *,
    act: int = ACT_SILU,
    unit_offset: bool = False,
    out: torch.Tensor | None = None,
    config: TileConfig | None = None,
) -> torch.Tensor:
    """``act(RMSNorm(x) @ Wg^T) * (RMSNorm(x) @ Wu^T)`` for ``gate_up_weight = cat([Wg, Wu])``:
    a layer's post-attention norm and its MLP's gate/up GEMM. One row (decode at batch 1) is
    one launch of `tilegym_norm_gate_up_gemv_kernel` (`NORM_GATE_UP_TILE`, or `config` when it
    is a GEMV tile); more rows take the norm kernel, then the fused gate-up GEMM."""
    k = x.shape[-1]
    _check(x, gate_up_weight, k)
    if gate_up_weight.shape[0] % 2:
        raise ValueError(f"gate_up_weight has an odd row count {gate_up_weight.shape[0]}")
    norm_weight = _norm_weight(norm_weight, k)
    x2 = _as_2d(x)
    m = x2.shape[0]
    one_launch = config.gemv if config is not None else m == 1
    if not one_launch or m == 0 or norm_weight.dtype != x.dtype:
        normed = _rms_norm.rms_norm(x, norm_weight, eps, unit_offset=unit_offset)
        mma = config if config is not None and not config.gemv else None
        return _fused_gate_up(normed, gate_up_weight, act, out, mma)
    cfg = config or NORM_GATE_UP_TILE
    i = gate_up_weight.shape[0] // 2
    if out is None:
        out = torch.empty(*x.shape[:-1], i, dtype=x.dtype, device=x.device)
    _launch_norm_gate_up(
        x2, norm_weight, eps, gate_up_weight, out.view(m, i), cfg, act, unit_offset
    )
    return out


def fused_gate_up_silu(
    x: torch.Tensor,
    gate_up_weight: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    config: TileConfig | None = None,
) -> torch.Tensor:
    """`silu(x @ Wg^T) * (x @ Wu^T)` for `gate_up_weight = cat([Wg, Wu])` of shape `[2I, K]`."""
    return _fused_gate_up(x, gate_up_weight, ACT_SILU, out, config)


def fused_gate_up_gelu_tanh(
    x: torch.Tensor,
    gate_up_weight: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    config: TileConfig | None = None,
) -> torch.Tensor:
    """`gelu_tanh(x @ Wg^T) * (x @ Wu^T)` (GELU's tanh approximation, `gelu_pytorch_tanh`) for
    `gate_up_weight = cat([Wg, Wu])`; tiles as for `fused_gate_up_silu`."""
    return _fused_gate_up(x, gate_up_weight, ACT_GELU_TANH, out, config)


def _fused_gate_up(x, gate_up_weight, act: int, out, config) -> torch.Tensor:
    k = x.shape[-1]
    _check(x, gate_up_weight, k)
    if gate_up_weight.shape[0] % 2:
        raise ValueError(f"gate_up_weight has an odd row count {gate_up_weight.shape[0]}")
    i = gate_up_weight.shape[0] // 2
    x2 = _as_2d(x)
    m = x2.shape[0]
    if out is None:
        out = torch.empty(*x.shape[:-1], i, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    cfg = config or choose_config(m, i, k, gated=True)
    if cfg.persistent:
        raise ValueError("the fused gate-up kernel has no persistent variant")
    if cfg.gemv:
        _launch_gate_up_gemv(x2, gate_up_weight, out.view(m, i), cfg, act)
        return out
    device = x.device
    split, mode, ws, cnt = _split_args(cfg, m, i, 2, device)
    grid = (math.ceil(m / cfg.tm) * math.ceil(i / cfg.tn), split, 1)
    out2 = out.view(m, i)
    args = (
        x2,
        gate_up_weight[:i],
        gate_up_weight[i:],
        out2,
        ws,
        cnt,
        split,
        cfg.tm,
        cfg.tn,
        cfg.tk,
        cfg.group_m,
        cfg.latency,
        cfg.transpose_tile,
        mode,
        cfg.swap,
        cfg.stagger,
        act,
    )
    kernel = hinted(tilegym_gate_up_silu_kernel, cfg, grid[0])
    _launch_mma(kernel, cfg, grid, args, device)
    if mode == SPLIT_PARTIAL:
        _launch_reduce(cfg, ws, split, None, None, out2, gated=True, act=act)
    return out


def _aot_cases(ops: tuple[str, ...]) -> list[tuple[str, TileConfig, bool]]:
    """(op, tiles, has_bias) the AOT gate compiles, each once: per op the default one-row
    (GEMV), decode and prefill tiles (`default_config`: not a table lookup, whose entries for
    any one shape change with tuning), both split-K reductions and the hinted variants; kept
    few because a compile takes seconds."""
    cases: list[tuple[str, TileConfig, bool]] = []
    for op in ops:
        gated = op in GATED_OPS
        wanted = [
            (default_config("single", gated), op == "linear"),
            (default_config("decode", gated), False),
            (default_config("large", gated), op == "linear"),
        ]
        if gated:  # the one-row gate/up GEMV
            wanted.append((GATE_UP_GEMV_TILE, False))
        wanted += [(TileConfig(16, 64, 128, split=4, reduce=r), False) for r in ("cta", "pdl")]
        wanted.append((TileConfig(128, 64 if gated else 128, 64, occupancy=1), False))
        wanted.append(
            (TileConfig(8, 64, 256, split=2, reduce="pdl", swap=True, stagger=True), False)
        )
        if not gated:
            for tm, tn, swap in ((128, 128, False), (16, 128, True)):
                cfg = TileConfig(tm, tn, 64, occupancy=1, persistent=True, swap=swap)
                wanted.append((cfg, False))
        for cfg, has_bias in wanted:
            if (op, cfg, has_bias) not in cases:
                cases.append((op, cfg, has_bias))
    return cases


#: the gated ops of `aot_signatures` and the activation each compiles
GATED_OPS = {"gated": ACT_SILU, "gated_gelu": ACT_GELU_TANH}


def _norm_gemv_sigs(sigs: dict, cfg: TileConfig, arr, dt, cconv) -> None:
    """`tilegym_norm_gemv_kernel` at one GEMV tile: with and without bias and PDL, the plain
    (Llama) norm weight."""
    from cuda.tile.compilation import KernelSignature, ScalarConstraint

    io = [arr(dt, 2), arr(dt, 1), arr(dt, 2), arr(dt, 1), arr(dt, 2)]  # X, NW, W, B, Y
    consts = [ScalarConstraint(ct.float32), *_gemv_tiles(cfg)]
    kernel = hinted(tilegym_norm_gemv_kernel, cfg, 1)
    for has_bias in (False, True):
        for pdl in (False, True):
            sig = KernelSignature([*io, *consts, has_bias, False, pdl], cconv)
            sigs.setdefault(kernel, []).append(sig)


def _norm_gate_up_sigs(sigs: dict, arr, dt, cconv) -> None:
    """`tilegym_norm_gate_up_gemv_kernel` at `NORM_GATE_UP_TILE`: SiLU, with and without PDL,
    the plain (Llama) norm weight."""
    from cuda.tile.compilation import KernelSignature, ScalarConstraint

    cfg = NORM_GATE_UP_TILE
    io = [arr(dt, 2), arr(dt, 1), arr(dt, 2, "w"), arr(dt, 2, "w"), arr(dt, 2)]  # X, NW, WG, WU, Y
    consts = [ScalarConstraint(ct.float32), *_gemv_tiles(cfg)]
    kernel = hinted(tilegym_norm_gate_up_gemv_kernel, cfg, 1)
    for pdl in (False, True):
        sig = KernelSignature([*io, *consts, False, ACT_SILU, pdl], cconv)
        sigs.setdefault(kernel, []).append(sig)


def norm_rope_signatures(
    head_dim: int,
    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,),
    cos_dtype=None,
    *,
    head_norm: bool = False,
    head_offset: bool = False,
    cache_write: bool = False,
    norm: bool = True,
    whole: bool = False,
) -> dict:
    """`tilegym_norm_rope_gemv_kernel` at `NORM_ROPE_TILE` for heads ``head_dim`` wide: with and
    without bias and PDL, the plain input norm weight, 16-byte aligned tensors (what a model
    passes); cos/sin in the activations' dtype unless ``cos_dtype``; ``head_norm`` (and
    ``head_offset``): the per-head q/k norms' form (``whole``: OLMo's whole-projection form);
    ``cache_write``: the static KV-cache write (transformers' int64 length); ``norm`` False:
    no input norm."""
    from cuda.tile.compilation import CallingConvention, KernelSignature, ScalarConstraint

    from tilegym.ops.attention import array_constraint as arr

    cfg = NORM_ROPE_TILE
    kernel = hinted(tilegym_norm_rope_gemv_kernel, cfg, 1)
    cconv = CallingConvention.cutile_python_v1()
    ct_dtypes = {torch.bfloat16: ct.bfloat16, torch.float16: ct.float16, torch.float32: ct.float32}
    f32, i32 = ScalarConstraint(ct.float32), ScalarConstraint(ct.int32)
    sigs = []
    for torch_dt in dtypes:
        dt = ct_dtypes[torch_dt]
        cdt = ct_dtypes[cos_dtype or torch_dt]
        io = [arr(dt, 2), arr(dt, 1), arr(dt, 2), arr(dt, 1), arr(cdt, 2), arr(cdt, 2)]
        io += [arr(dt, 2), arr(dt, 2), arr(ct.float32, 3), arr(ct.int32, 1), arr(dt, 2)]
        io += [arr(dt, 3), arr(dt, 4), arr(dt, 4), arr(ct.int32, 1)]
        io += [arr(ct.int64 if cache_write else ct.int32, 1)]
        scalars = [f32, f32, i32, i32, head_dim // 2, *_gemv_tiles(cfg)]
        for has_bias in (False, True):
            for pdl in (False, True):
                flags = [has_bias, False, head_norm, head_norm and head_offset, cache_write]
                flags += [norm, head_norm and whole, pdl]
                sigs.append(KernelSignature([*io, *scalars, *flags], cconv))
    return {kernel: sigs}


def aot_signatures(
    ops: tuple[str, ...] = ("linear", "residual", "gated"),
    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16),
) -> dict:
    """`{kernel: [KernelSignature, ...]}` for the kernels of `ops` ('linear', 'residual',
    'gated', 'gated_gelu': the gated kernel with GELU-tanh, 'norm': the norm-prologue GEMV of
    `rms_norm_linear`, 'norm_gated': that of `rms_norm_gate_up`); by default the GEMM kernels,
    in bf16 and fp16.

    Each case compiles twice: for any input, and for 16-byte aligned bases and row strides,
    which is what the models' tensors are and what the runtime specializes on. Only the
    aligned variant takes the TMA path (sm_90 SASS: UTMALDG); the other loads element-wise."""
    from cuda.tile.compilation import ArrayConstraint, CallingConvention, KernelSignature

    itemsize = {ct.bfloat16: 2, ct.float16: 2, ct.float32: 4, ct.int32: 4}

    def array_constraints(aligned: bool):
        def arr(dtype, ndim, group=None):
            step = 16 // itemsize[dtype] if aligned else 1
            return ArrayConstraint(
                dtype,
                ndim,
                index_dtype=ct.int32,
                stride_lower_bound_incl=0,
                alias_groups=(group,) if group else (),
                may_alias_internally=False,
                stride_constant=(None,) * (ndim - 1) + (1,),
                stride_divisible_by=(step,) * (ndim - 1) + (1,),
                base_addr_divisible_by=16 if aligned else 1,
            )

        return arr

    ct_dtypes = {torch.bfloat16: ct.bfloat16, torch.float16: ct.float16}
    cconv = CallingConvention.cutile_python_v1()
    split = ct.compilation.ScalarConstraint(ct.int32)
    sigs: dict = {}
    for torch_dt, aligned in [(dt, a) for dt in dtypes for a in (False, True)]:
        arr = array_constraints(aligned)
        dt = ct_dtypes[torch_dt]
        for op, cfg, has_bias in _aot_cases(ops):
            mode = split_mode(cfg)
            consts = [split, cfg.tm, cfg.tn, cfg.tk, cfg.group_m]
            consts += [cfg.latency, cfg.transpose_tile, mode]
            work = [arr(ct.float32, 3), arr(ct.int32, 1)]
            has_res, gated = op == "residual", op in GATED_OPS
            act = GATED_OPS.get(op, ACT_SILU)
            io = [arr(dt, 2), arr(dt, 2), arr(dt, 1), arr(dt, 2), arr(dt, 2)]  # X, W, B, R, Y
            if op == "norm":  # the norm-prologue GEMV: one-row tiles only, biased or not
                if cfg.gemv:
                    _norm_gemv_sigs(sigs, cfg, arr, dt, cconv)
                continue
            if op == "norm_gated":  # the norm-prologue gate/up GEMV at its one tile
                if cfg == default_config("single", False):  # once per dtype and alignment
                    _norm_gate_up_sigs(sigs, arr, dt, cconv)
                continue
            if cfg.gemv and gated:
                kernel = hinted(tilegym_gate_up_gemv_kernel, cfg, 1)
                params = [arr(dt, 2), arr(dt, 2, "w"), arr(dt, 2, "w"), arr(dt, 2)]
                for pdl in (False, True):
                    sig = KernelSignature([*params, *_gemv_tiles(cfg), act, pdl], cconv)
                    sigs.setdefault(kernel, []).append(sig)
                continue
            if cfg.gemv:
                consts = list(_gemv_tiles(cfg))
                kernel = hinted(tilegym_gemv_kernel, cfg, 1)
                for pdl in (False, True):  # GEMV_PDL either way
                    sig = KernelSignature([*io, *consts, has_bias, has_res, pdl], cconv)
                    sigs.setdefault(kernel, []).append(sig)
                continue
            if cfg.persistent:
                consts = [cfg.tm, cfg.tn, cfg.tk, cfg.group_m, cfg.latency, cfg.transpose_tile]
                kernel = hinted(tilegym_linear_persistent_kernel, cfg, 1)
                sig = KernelSignature(
                    [*io, *consts, has_bias, has_res, cfg.swap, cfg.stagger], cconv
                )
                sigs.setdefault(kernel, []).append(sig)
                continue
            if gated:
                params = [arr(dt, 2), arr(dt, 2, "w"), arr(dt, 2, "w"), arr(dt, 2), *work]
                kernel, tail = tilegym_gate_up_silu_kernel, [cfg.swap, cfg.stagger, act]
            else:
                params = [*io, *work]
                kernel, tail = tilegym_linear_kernel, [has_bias, has_res, cfg.swap, cfg.stagger]
            kernel = hinted(kernel, cfg, max(cfg.ctas, 1))
            for pdl in (False, True) if cfg.tm <= DECODE_MAX_M else (False,):  # MMA_PDL's code
                sig = KernelSignature([*params, *consts, *tail, pdl], cconv)
                sigs.setdefault(kernel, []).append(sig)
            if mode == SPLIT_PARTIAL:
                params = [arr(ct.float32, 3), arr(dt, 1), arr(dt, 2), arr(dt, 2), split]
                flags = [cfg.tm, cfg.tn, has_bias, has_res, gated, act]
                sigs.setdefault(tilegym_splitk_reduce_kernel, []).append(
                    KernelSignature([*params, *flags], cconv)
                )
    return sigs


__all__ = [
    "TileConfig",
    "aot_signatures",
    "fused_gate_up_gelu_tanh",
    "fused_gate_up_silu",
    "linear",
    "linear_residual",
    "rms_norm_gate_up",
    "rms_norm_linear",
    "split_mode",
]
