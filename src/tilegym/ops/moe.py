"""Mixture-of-experts block as transformers' Qwen3-MoE computes it, in cuTile.

`moe_route` is the router after its linear: softmax over the experts in fp32, top-k, optional
renormalization over the k, cast to the logits dtype (`Qwen3MoeTopKRouter.forward`), in one
kernel with a block of tokens per program.

`moe_experts` is `Qwen3MoeExperts.forward` (+ the decoder layer's residual add):
``out[t] = residual[t] + sum_j w[t, j] * down[e] @ (silu(g) * u)``, ``[g; u] = gate_up[e] @ x[t]``,
``e = ids[t, j]``. Its kernels:

1. dispatch: the ``T*k`` (token, slot) pairs are laid out in ``BM``-row blocks of one expert
   each. It writes the slot of every padded row (``n_slots`` as the padding sentinel), the
   padded row of every slot, and the expert of every block (``n_experts`` for blocks past the
   last). ``sorted`` groups each expert's slots into as few blocks as it can: per-expert counts
   by atomic add (the returned old count is the slot's rank within its expert), a scan in one
   program, and a scatter; ``per_slot`` gives every slot its own block, for decode, where the
   sorting costs more than re-reading the few experts that two tokens share (a one-program
   sorting dispatch, tried too, was slower than either at T = 1 and 8).
2. row gather: the block's hidden rows (token = slot // k; zero rows for padding) are copied
   into an ``[padded rows, H]`` buffer in block order.
3. grouped GEMM 1: per (block, column tile of I), the block's gathered rows times the expert's
   gate rows and up rows, and ``silu(g) * u`` is stored for the block's rows of an
   ``[padded rows, I]`` intermediate. Both operands are loaded as tiles (through shared
   memory): gathering the rows inside this kernel put them in registers, and the sm_90 build
   then had no mma instruction at all.
4. grouped GEMM 2: that intermediate times ``down[e]^T`` per block into ``[padded rows, H]``,
   in the activation dtype: a bf16 round trip is half of an fp32 one (prefill T = 2048, k = 8,
   H = 2048: 67 MB less traffic), and it is the one rounding of an fp32-accumulated result that
   transformers' own path also makes on each expert output.
5. combine: per token, its k rows are gathered back, weighted by the routing weights and summed
   in a fixed order in fp32, plus the residual, then cast once. No float atomics: the result
   does not depend on the order of rows inside an expert.

The grids depend only on T, k, E and the block size (blocks past the used ones return at
once) and nothing is read back to the host, so a call can be captured in a CUDA graph.
A program reads its expert's weight tile once for all rows of its block, so an expert's
weights are read once per block. At decode a block holds one slot; the weight tile is then the
mma's A operand (`MoeConfig.swap`), so the mma's 64-row side holds weight rows, not padding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import cuda.tile as ct
import torch
from cuda.tile.compilation import ScalarConstraint

from tilegym.ops._common import (
    PAD_ZERO,
    aligned_array_sig,
    keep_in_slot,
    next_pow2,
    signature,
    stream,
    take_max,
    with_hints,
)

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
_NEG_INF = ct.PaddingMode.NEG_INF

#: `choose_config` gives every slot its own block up to this many slots
PER_SLOT_MAX = 64
#: slots per step of the per-slot dispatch's one program
PER_SLOT_TILE = 1024
#: slots per program of the count and scatter kernels (and rows per sentinel-fill store)
SLOT_TILE = 1024
#: the scan's (blocks x experts) comparison tile holds about this many int32s
SCAN_ELEMS = 4096
#: routing-weight tile of the router kernel: about this many fp32 probabilities per program
ROUTE_ELEMS = 2048
#: the router's top-k rounds take one maximum a round over int64 keys (a probability's bits
#: above its column's complement: the largest probability, then the first column) instead of
#: a max and an argmax: 4.3 against 8.4 us a call for qwen3_next's 512 experts at one token a
#: program on an H100 (``bench_moe_route.py``).
ROUTE_PACKED = True
#: the router takes one token a program up to this many tokens: one wave on the 132 SMs of an
#: H100 SXM or H200 (`route_rows`)
ONE_ROW_TOKENS = 128
#: how `moe_dispatch` groups the slots (`MoeConfig.dispatch`)
DISPATCHES = ("sorted", "per_slot", "direct")
#: the dispatches that give every slot its own block (slot s is block s)
SLOT_BLOCKS = ("per_slot", "direct")
#: columns per program of the row-gather kernel
GATHER_COLS = 256
#: rows x columns gathered per program of the combine kernel
COMBINE_ROWS = 32
COMBINE_COLS = 256

_DTYPES = (torch.bfloat16, torch.float16)
_CT = {torch.bfloat16: ct.bfloat16, torch.float16: ct.float16, torch.float32: ct.float32}


# ---------------------------------------------------------------------------------------------
# Router
# ---------------------------------------------------------------------------------------------


@ct.kernel
def tilegym_moe_route_kernel(
    Logits,
    Weights,
    Ids,
    TM: ConstInt,
    EP: ConstInt,
    TOP_K: ConstInt,
    KP: ConstInt,
    NORMALIZE: ConstBool,
    PACKED: ConstBool,
):
    """Top-k of softmax(Logits[T, E]) for TM tokens: Weights/Ids [T, TOP_K].

    EP (a power of two >= E) columns are loaded with -inf past E (probability 0); each of the
    TOP_K rounds takes the row maximum, its first index, and masks that column with -1 (below
    every probability). KP is TOP_K rounded up to a power of two (the stored tile). PACKED:
    each round is one maximum over int64 keys ``bits(p) << 32 | (EP - 1 - column)`` (a
    probability's bits order like the probability, p >= 0), the taken key set to -1.
    """
    bt = ct.bid(0)
    x = ct.astype(ct.load(Logits, (bt, 0), (TM, EP), padding_mode=_NEG_INF), ct.float32)
    p = ct.exp(x - ct.max(x, axis=1, keepdims=True))
    p = p / ct.sum(p, axis=1, keepdims=True)
    cols = ct.broadcast_to(ct.reshape(ct.arange(EP, dtype=ct.int32), (1, EP)), (TM, EP))
    slot = ct.broadcast_to(ct.reshape(ct.arange(KP, dtype=ct.int32), (1, KP)), (TM, KP))
    vals = ct.full((TM, KP), 0.0, dtype=ct.float32)
    idx = ct.full((TM, KP), 0, dtype=ct.int32)
    if PACKED:
        high = ct.bitwise_lshift(ct.astype(ct.bitcast(p, ct.int32), ct.int64), 32)
        key = ct.bitwise_or(high, ct.astype(EP - 1 - cols, ct.int64))
        taken = ct.full((TM, EP), -1, dtype=ct.int64)
        for j in range(TOP_K):
            top = ct.max(key, axis=1, keepdims=True)
            best = ct.bitcast(ct.astype(ct.bitwise_rshift(top, 32), ct.int32), ct.float32)
            arg = EP - 1 - ct.astype(ct.bitwise_and(top, (1 << 32) - 1), ct.int32)
            vals, idx = keep_in_slot(vals, idx, slot, j, best, arg)
            key = ct.where(key == ct.broadcast_to(top, (TM, EP)), taken, key)
    else:
        gone = ct.full((TM, EP), -1.0, dtype=ct.float32)
        for j in range(TOP_K):
            p, vals, idx = take_max(p, cols, slot, j, vals, idx, gone)
    if NORMALIZE:
        vals = vals / ct.sum(vals, axis=1, keepdims=True)
    ct.store(Weights, (bt, 0), ct.astype(vals, Weights.dtype))
    ct.store(Ids, (bt, 0), idx)


def route_tiles(n_experts: int, top_k: int) -> tuple[int, int, int]:
    """(TM, EP, KP) of the router kernel."""
    ep = next_pow2(n_experts)
    return max(1, min(64, ROUTE_ELEMS // ep)), ep, next_pow2(top_k)


def route_rows(tokens: int, tm: int) -> int:
    """Tokens a program: one up to ``ONE_ROW_TOKENS`` (decode), else TM. At 1 and 8 tokens one
    row a program took 4.3 against 10.4 us (qwen3_next) and 2.0 against 3.9 us (gpt_oss) on an
    H100: the TM-row tile's masked rows cost more than the programs it saves."""
    return 1 if tokens <= ONE_ROW_TOKENS else tm


def _check_route(router_logits: torch.Tensor, top_k: int) -> None:
    """One clear ValueError for inputs the router kernel does not take."""
    if not router_logits.is_cuda:
        raise ValueError(f"router_logits must be a CUDA tensor, got {router_logits.device}")
    if router_logits.dtype not in (*_DTYPES, torch.float32):
        raise ValueError(f"router_logits dtype {router_logits.dtype} is not supported")
    if router_logits.dim() != 2:
        raise ValueError(f"router_logits must be [T, E], got {tuple(router_logits.shape)}")
    if not 1 <= top_k <= router_logits.shape[1]:
        raise ValueError(f"top_k={top_k} must lie in [1, {router_logits.shape[1]}]")


def moe_route(
    router_logits: torch.Tensor,
    top_k: int,
    normalize: bool,
    *,
    tile_rows: int | None = None,
    packed: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, top_k] in the logits dtype, expert ids [T, top_k] int32), best first.
    ``tile_rows`` (tokens a program, a power of two) and ``packed`` override ``route_tiles``'s
    rows and ``ROUTE_PACKED`` (benchmarks and tests)."""
    if tile_rows is not None and (tile_rows < 1 or tile_rows & (tile_rows - 1)):
        raise ValueError(f"tile_rows={tile_rows} must be a power of two")
    _check_route(router_logits, top_k)
    t, e = router_logits.shape
    logits = router_logits if router_logits.stride(-1) == 1 else router_logits.contiguous()
    dev = logits.device
    weights = torch.empty((t, top_k), dtype=logits.dtype, device=dev)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=dev)
    if t:
        tm, ep, kp = route_tiles(e, top_k)
        tm = route_rows(t, tm) if tile_rows is None else tile_rows
        pack = ROUTE_PACKED if packed is None else packed
        args = (logits, weights, ids, tm, ep, top_k, kp, bool(normalize), bool(pack))
        ct.launch(stream(dev), (math.ceil(t / tm), 1, 1), tilegym_moe_route_kernel, args)
    return weights, ids


def moe_route_reference(
    router_logits: torch.Tensor, top_k: int, normalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """`Qwen3MoeTopKRouter.forward` after its linear (fp32 softmax), ids as int32."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    top, ids = torch.topk(probs, top_k, dim=-1)
    if normalize:
        top = top / top.sum(dim=-1, keepdim=True)
    return top.to(router_logits.dtype), ids.to(torch.int32)


# ---------------------------------------------------------------------------------------------
# Dispatch: (token, slot) pairs grouped by expert into padded blocks
# ---------------------------------------------------------------------------------------------


def _slot_ids(Ids, c, n_experts, missing, TS):
    """(slots, valid, expert) of the TS-slot chunk c; expert is ``missing`` where the slot is
    past the end or its id is outside [0, n_experts)."""
    n = Ids.shape[0]
    slots = c * TS + ct.arange(TS, dtype=ct.int32)
    ids = ct.load(Ids, (c,), (TS,), padding_mode=PAD_ZERO)
    valid = (slots < n) & (ids >= 0) & (ids < n_experts)
    return slots, valid, ct.where(valid, ids, missing)


def _layout(counts, BM):
    """(first block past each expert, first padded row of each expert) from per-expert counts."""
    blocks = (counts + (BM - 1)) // BM
    block_end = ct.cumsum(blocks, axis=0)
    return block_end, (block_end - blocks) * BM


def _store_block_experts(BlockExpert, block_end, n_experts, EP, BP):
    """BlockExpert[b] = the expert whose blocks contain b: the count of experts ending at or
    before b (n_experts for blocks past the last used one)."""
    ends = ct.broadcast_to(ct.reshape(block_end, (1, EP)), (BP, EP))
    for bc in range(ct.cdiv(BlockExpert.shape[0], BP)):
        b = ct.broadcast_to(ct.reshape(bc * BP + ct.arange(BP, dtype=ct.int32), (BP, 1)), (BP, EP))
        expert = ct.sum(ct.astype(ends <= b, ct.int32), axis=1)
        ct.store(BlockExpert, (bc,), ct.minimum(expert, n_experts))


def _fill_sentinel(Sorted, first, step, value, RC):
    """Sorted[chunk c] = value for the RC-row chunks first, first + step, ..."""
    fill = ct.full((RC,), 0, dtype=ct.int32) + value
    for rc in range(first, ct.cdiv(Sorted.shape[0], RC), step):
        ct.store(Sorted, (rc,), fill, allow_tma=False)


@ct.kernel
def tilegym_moe_count_kernel(Ids, Counts, Rank, Sorted, TS: ConstInt):
    """Rank[s] = old Counts[expert of s] of an atomic increment (the slot's place inside its
    expert); Counts must be zero before. Also fills Sorted with the sentinel S, grid-strided
    (the scatter two launches later overwrites the used rows)."""
    c = ct.bid(0)
    n_experts = Counts.shape[0]
    _, _, expert = _slot_ids(Ids, c, n_experts, n_experts, TS)
    rank = ct.atomic_add(Counts, expert, 1, memory_order=ct.MemoryOrder.RELAXED)
    ct.store(Rank, (c,), rank)
    _fill_sentinel(Sorted, c, ct.num_blocks(0), Ids.shape[0], TS)


@ct.kernel
def tilegym_moe_scan_kernel(
    Counts, RowStart, BlockExpert, BM: ConstInt, EP: ConstInt, BP: ConstInt
):
    """One program: each expert's first padded row (RowStart) and each block's expert."""
    n_experts = Counts.shape[0]
    counts = ct.load(Counts, (0,), (EP,), padding_mode=PAD_ZERO)
    block_end, row_start = _layout(counts, BM)
    ct.store(RowStart, (0,), row_start)
    _store_block_experts(BlockExpert, block_end, n_experts, EP, BP)


@ct.kernel
def tilegym_moe_scatter_kernel(Ids, Rank, RowStart, Sorted, Pos, TS: ConstInt):
    """Pos[s] = RowStart[expert] + Rank[s]; Sorted[Pos[s]] = s (invalid slots: Pos = rows)."""
    c = ct.bid(0)
    slots, valid, expert = _slot_ids(Ids, c, RowStart.shape[0], 0, TS)
    start = ct.gather(RowStart, expert, mask=valid)
    pos = start + ct.load(Rank, (c,), (TS,), padding_mode=PAD_ZERO)
    ct.scatter(Sorted, pos, slots, mask=valid)
    ct.store(Pos, (c,), ct.where(valid, pos, Sorted.shape[0]))


@ct.kernel
def tilegym_moe_dispatch_per_slot_kernel(
    Ids, Sorted, Pos, BlockExpert, n_experts: int, BM: ConstInt, SP: ConstInt
):
    """Every slot its own block, in slot order (one program, SP slots per step): block s holds
    slot s in its first row and padding after; a slot with an id outside the experts gets the
    sentinels (block expert n_experts, row S*BM)."""
    n = Ids.shape[0]
    first_col = ct.reshape(ct.arange(BM, dtype=ct.int32), (1, BM)) == 0
    for c in range(ct.cdiv(n, SP)):
        slots, valid, expert = _slot_ids(Ids, c, n_experts, n_experts, SP)
        inside = slots < n
        ct.scatter(BlockExpert, slots, expert, mask=inside)
        ct.scatter(Pos, slots, ct.where(valid, slots * BM, n * BM), mask=inside)
        col = ct.reshape(slots, (SP, 1))
        rows = col * BM + ct.reshape(ct.arange(BM, dtype=ct.int32), (1, BM))
        mine = ct.broadcast_to(ct.reshape(valid, (SP, 1)), (SP, BM)) & first_col
        slot_of_row = ct.where(mine, ct.broadcast_to(col, (SP, BM)), n)
        inside_rows = ct.broadcast_to(ct.reshape(inside, (SP, 1)), (SP, BM))
        ct.scatter(Sorted, rows, slot_of_row, mask=inside_rows)


# ---------------------------------------------------------------------------------------------
# Grouped GEMMs and the combine
# ---------------------------------------------------------------------------------------------


def _acc(BM, BN, swap):
    """fp32 accumulator: (BM, BN), or (BN, BM) with the operands swapped."""
    if swap:
        return ct.full((BN, BM), 0, dtype=ct.float32)
    return ct.full((BM, BN), 0, dtype=ct.float32)


def _mma(x, w, acc, swap):
    """acc += x (BM, TK) @ w (BN, TK)^T; swapped, the weight tile is the mma's A operand."""
    if swap:
        return ct.mma(w, ct.transpose(x), acc)
    return ct.mma(x, ct.transpose(w), acc)


def _acc_out(acc, swap):
    """The accumulator as a (BM, BN) tile."""
    return ct.transpose(acc) if swap else acc


def _weight_tile(W, e, bn, k, BN, TK):
    """Rows [bn*BN, +BN) x columns [k*TK, +TK) of expert e's [N, K] matrix in W [E, N, K]."""
    return ct.reshape(ct.load(W, (e, bn, k), (1, BN, TK), padding_mode=PAD_ZERO), (BN, TK))


def _valid_expert(e, n_experts):
    return (e >= 0) & (e < n_experts)


def _gate_up_block(Xs, xb, e, Wg, Wu, A, b, bn, BM, BN, TK, SWAP):
    gate = _acc(BM, BN, SWAP)
    up = _acc(BM, BN, SWAP)
    for k in range(ct.num_tiles(Xs, axis=1, shape=(BM, TK))):
        x = ct.load(Xs, (xb, k), (BM, TK), padding_mode=PAD_ZERO)
        gate = _mma(x, _weight_tile(Wg, e, bn, k, BN, TK), gate, SWAP)
        up = _mma(x, _weight_tile(Wu, e, bn, k, BN, TK), up, SWAP)
    act = gate / (1.0 + ct.exp(-gate)) * up
    ct.store(A, (b, bn), ct.astype(_acc_out(act, SWAP), A.dtype))


@ct.kernel
def tilegym_moe_gate_up_kernel(
    Xs,
    BlockExpert,
    Wg,
    Wu,
    A,
    BM: ConstInt,
    BN: ConstInt,
    TK: ConstInt,
    SWAP: ConstBool,
    DIRECT_K: ConstInt,
):
    """A[block rows, bn tile] = silu(Xs @ Wg[e]^T) * (Xs @ Wu[e]^T) for the block's rows of the
    pre-gathered hidden rows Xs (`tilegym_moe_gather_rows_kernel`). Grid (blocks, I tiles).

    Xs tiles load like the weight tiles, so both mma operands come through shared memory. With
    the rows gathered here instead, into registers, the sm_90 build had no mma instruction at
    all (scalar FMUL/FADD): 7-9% of the copy bandwidth at decode against 29-87% now.

    ``DIRECT_K`` > 0 (the ``direct`` dispatch, top-k ``DIRECT_K``): block b is slot b, Xs the
    hidden states and BlockExpert the router's flat ids; the slot's token row loads from a
    one-row view of Xs, zero-padded to BM rows (still a tile load: no gather kernel, no
    dispatch kernel)."""
    b = ct.bid(0)
    bn = ct.bid(1)
    e = ct.gather(BlockExpert, b)
    if _valid_expert(e, Wg.shape[0]):
        if DIRECT_K > 0:
            token = b // DIRECT_K
            row = Xs.slice(axis=0, start=token, stop=token + 1)
            _gate_up_block(row, 0, e, Wg, Wu, A, b, bn, BM, BN, TK, SWAP)
        else:
            _gate_up_block(Xs, b, e, Wg, Wu, A, b, bn, BM, BN, TK, SWAP)


@ct.kernel
def tilegym_moe_gather_rows_kernel(
    X, Sorted, BlockExpert, Xs, top_k: int, n_experts: int, BM: ConstInt, TH: ConstInt
):
    """Xs[block rows, h tile] = X[token of each row] (a zero row for padding): the hidden rows
    in the dispatch's order, so that the grouped GEMM loads them as plain tiles. Grid (blocks,
    H tiles); blocks past the used ones return at once."""
    b = ct.bid(0)
    h = ct.bid(1)
    if ct.gather(BlockExpert, b) < n_experts:
        tokens = ct.load(Sorted, (b,), (BM,)) // top_k
        rows = ct.load_advanced_indexing(
            X, (tokens, ct.Slice(h * TH, TH)), padding_mode=PAD_ZERO, allow_tma=False
        )
        ct.store(Xs, (b, h), rows)


@ct.kernel
def tilegym_moe_down_kernel(
    A,
    BlockExpert,
    Wd,
    Y,
    BM: ConstInt,
    BN: ConstInt,
    TK: ConstInt,
    SWAP: ConstBool,
):
    """Y[block rows, bn tile] = A[block rows] @ Wd[e]^T. Grid (blocks, H tiles)."""
    b = ct.bid(0)
    bn = ct.bid(1)
    e = ct.gather(BlockExpert, b)
    if _valid_expert(e, Wd.shape[0]):
        ct.store(Y, (b, bn), ct.astype(_rows_times(A, b, e, Wd, bn, BM, BN, TK, SWAP), Y.dtype))


def _rows_times(Xs, xb, e, W, bn, BM, BN, TK, SWAP):
    """fp32 (BM, BN): rows [xb*BM, +BM) of Xs times expert e's rows [bn*BN, +BN) of W."""
    acc = _acc(BM, BN, SWAP)
    for k in range(ct.num_tiles(Xs, axis=1, shape=(BM, TK))):
        x = ct.load(Xs, (xb, k), (BM, TK), padding_mode=PAD_ZERO)
        acc = _mma(x, _weight_tile(W, e, bn, k, BN, TK), acc, SWAP)
    return _acc_out(acc, SWAP)


@ct.kernel
def tilegym_moe_combine_kernel(
    Y,
    Pos,
    Wts,
    R,
    Out,
    n_experts: int,
    TT: ConstInt,
    KP: ConstInt,
    TH: ConstInt,
    HAS_RES: ConstBool,
    DIRECT_BM: ConstInt,
):
    """Out[t] = (R[t] +) sum_j Wts[t, j] * Y[Pos[t, j]] in fp32, for TT tokens x TH columns.

    Pos/Wts are [T, k]; missing (t, j) get the row count of Y as their row (a zero row) and
    weight 0. The sum runs over j in order: the result does not depend on the dispatch's row
    order. ``DIRECT_BM`` > 0 (the ``direct`` dispatch): Pos holds the expert ids and slot
    ``t * k + j``'s row is ``(t * k + j) * DIRECT_BM``, missing for an id outside
    ``[0, n_experts)``."""
    bt = ct.bid(0)
    bh = ct.bid(1)
    t = ct.broadcast_to(ct.reshape(bt * TT + ct.arange(TT, dtype=ct.int32), (TT, 1)), (TT, KP))
    j = ct.broadcast_to(ct.reshape(ct.arange(KP, dtype=ct.int32), (1, KP)), (TT, KP))
    valid = (t < Out.shape[0]) & (j < Pos.shape[1])
    given = ct.load(Pos, (bt, 0), (TT, KP), padding_mode=PAD_ZERO)
    if DIRECT_BM > 0:
        valid = valid & _valid_expert(given, n_experts)
        given = (t * Pos.shape[1] + j) * DIRECT_BM
    pos = ct.where(valid, given, Y.shape[0])
    w = ct.astype(ct.load(Wts, (bt, 0), (TT, KP), padding_mode=PAD_ZERO), ct.float32)
    rows = ct.load_advanced_indexing(
        Y,
        (ct.reshape(pos, (TT * KP,)), ct.Slice(bh * TH, TH)),
        padding_mode=PAD_ZERO,
        allow_tma=False,
    )
    y = ct.astype(ct.reshape(rows, (TT, KP, TH)), ct.float32)
    acc = ct.sum(y * ct.reshape(w, (TT, KP, 1)), axis=1)
    if HAS_RES:
        acc = acc + ct.astype(ct.load(R, (bt, bh), (TT, TH), padding_mode=PAD_ZERO), ct.float32)
    ct.store(Out, (bt, bh), ct.astype(acc, Out.dtype))


# ---------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MoeConfig:
    """Tiles of one `moe_experts` call.

    bm: rows per block (each expert's rows are padded to a multiple); bn_up / bn_down: column
    tiles of GEMM 1 (over I) and GEMM 2 (over H); tk: K tile of both; swap: weight tile as the
    mma's A operand (few rows per block); occupancy: the GEMMs' occupancy hint (0: the
    compiler's choice). dispatch: how slots become blocks: ``sorted`` (count, scan, scatter)
    or ``per_slot`` (every slot its own block, in slot order: no grouping, so an expert chosen
    by two tokens is read twice; laid out by a dispatch kernel, rows gathered by another) or
    ``direct`` (the per-slot blocks without those two kernels: the GEMMs take the router's ids
    as the block experts and load each slot's token row themselves).
    """

    bm: int
    bn_up: int
    bn_down: int
    tk: int
    swap: bool = False
    dispatch: str = "sorted"
    occupancy: int = 0

    def __post_init__(self) -> None:
        for name in ("bm", "bn_up", "bn_down", "tk"):
            v = getattr(self, name)
            if v < 8 or v & (v - 1):
                raise ValueError(f"{name}={v} must be a power of two >= 8")
        if self.occupancy < 0:
            raise ValueError(f"occupancy={self.occupancy} must be >= 0")
        if self.dispatch not in DISPATCHES:
            raise ValueError(f"dispatch={self.dispatch!r} must be one of {DISPATCHES}")


def choose_config(n_slots: int, n_experts: int) -> MoeConfig:
    """Tiles by the mean rows per expert (``n_slots / n_experts``), measured on the H200
    (`benchmarks/ops/bench_moe.py --sweep`, Qwen3-30B-A3B's experts).

    Decode (<= 8 rows per expert, e.g. T <= 128 at k = 8 of 128 experts): 8-row blocks with the
    weight tile as the mma's A operand and 64 weight rows per tile on both GEMMs (the sm_90
    warpgroup mma's M; with 32, GEMM 1 ran 3x slower). Up to `PER_SLOT_MAX` slots every slot is
    its own block: the sorting dispatch cost more than the few experts that two tokens share.
    There the ``direct`` dispatch (the GEMMs read the router's ids; no dispatch kernel, no row
    gather) beat ``per_slot``: 41.2 vs 43.9 us at T = 1, 140.4 vs 145.8 us at T = 8 (graph
    replay, spreads 2-4%).
    Prefill: 64-row blocks (an expert wastes < 64 padded rows; 128-row blocks would pad
    Qwen3-30B-A3B's 128 rows per expert at T = 2048 by half again, and ran 1.7x slower) and
    64 x 128 tiles.
    """
    per_expert = n_slots / max(n_experts, 1)
    if per_expert <= 8:
        dispatch = "direct" if n_slots <= PER_SLOT_MAX else "sorted"
        return MoeConfig(8, 64, 64, 128, swap=True, dispatch=dispatch, occupancy=2)
    if per_expert <= 16:
        return MoeConfig(16, 64, 64, 128, swap=True, occupancy=2)
    if per_expert <= 32:
        return MoeConfig(32, 64, 128, 64, swap=True)
    return MoeConfig(64, 128, 128, 64)


def _hinted(kernel, cfg: MoeConfig):
    """The GEMM kernel with the config's occupancy hint (compiled once per hint)."""
    return with_hints(kernel, occupancy=cfg.occupancy) if cfg.occupancy else kernel


def max_blocks(n_slots: int, n_experts: int, bm: int) -> int:
    """Upper bound on used blocks: each holds >= 1 slot, and padding adds < 1 block per
    expert that has slots."""
    return max(1, min(n_slots, math.ceil(n_slots / bm) + min(n_experts, n_slots)))


def n_blocks(n_slots: int, n_experts: int, bm: int, dispatch: str = "sorted") -> int:
    """Blocks of the GEMM grids' first extent: one per slot for ``per_slot`` and ``direct``,
    else `max_blocks` (what `moe_dispatch` lays out)."""
    if dispatch in SLOT_BLOCKS:
        return n_slots
    return max_blocks(n_slots, n_experts, bm)


def per_slot_tile(n_slots: int) -> int:
    """Slots per step of the per-slot dispatch."""
    return min(PER_SLOT_TILE, next_pow2(n_slots))


def dispatch_tiles(n_experts: int) -> tuple[int, int]:
    """(EP, chunk): the padded expert count and the scan's blocks per step."""
    ep = next_pow2(n_experts)
    return ep, max(8, min(64, SCAN_ELEMS // ep))


def gather_tile(hidden: int) -> int:
    """Columns per program of the row-gather kernel."""
    return min(GATHER_COLS, next_pow2(hidden))


def combine_tiles(top_k: int, hidden: int) -> tuple[int, int, int]:
    """(TT, KP, TH) of the combine kernel."""
    kp = next_pow2(top_k)
    return max(1, COMBINE_ROWS // kp), kp, min(COMBINE_COLS, next_pow2(hidden))


def _carve(numels: list[int], device) -> list[torch.Tensor]:
    """int32 views of one allocation, each starting 16-byte aligned."""
    starts, total = [], 0
    for n in numels:
        starts.append(total)
        total += -(-n // 4) * 4
    buf = torch.empty(max(total, 4), dtype=torch.int32, device=device)
    return [buf[s : s + n] for s, n in zip(starts, numels, strict=True)]


def moe_dispatch(
    ids: torch.Tensor, n_experts: int, bm: int, dispatch: str = "sorted"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted slot per padded row [MB*bm], padded row per slot [S], expert per block [MB]) for
    flat int32 ``ids`` [S]; sentinels: S (rows), MB*bm (slots with an id outside the experts),
    n_experts (blocks). ``dispatch``: `MoeConfig.dispatch`."""
    if dispatch == "direct":
        raise ValueError("the direct dispatch has no dispatch kernel (its GEMMs take the ids)")
    n = ids.numel()
    dev = ids.device
    mb = n_blocks(n, n_experts, bm, dispatch)
    sorted_, pos, bexp = _carve([mb * bm, n, mb], dev)
    s = stream(dev)
    if dispatch == "per_slot":
        args = (ids, sorted_, pos, bexp, n_experts, bm, per_slot_tile(n))
        ct.launch(s, (1, 1, 1), tilegym_moe_dispatch_per_slot_kernel, args)
        return sorted_, pos, bexp
    ep, chunk = dispatch_tiles(n_experts)
    counts = torch.zeros(n_experts, dtype=torch.int32, device=dev)
    rank, row_start = _carve([n, n_experts], dev)
    grid = (math.ceil(n / SLOT_TILE), 1, 1)
    ct.launch(s, grid, tilegym_moe_count_kernel, (ids, counts, rank, sorted_, SLOT_TILE))
    ct.launch(s, (1, 1, 1), tilegym_moe_scan_kernel, (counts, row_start, bexp, bm, ep, chunk))
    args = (ids, rank, row_start, sorted_, pos, SLOT_TILE)
    ct.launch(s, grid, tilegym_moe_scatter_kernel, args)
    return sorted_, pos, bexp


def dispatch_reference(
    ids: torch.Tensor, n_experts: int, bm: int, dispatch: str = "sorted"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What `moe_dispatch` writes, in plain PyTorch: for ``per_slot`` its exact layout (also
    the rows the ``direct`` dispatch's GEMMs use), else the grouped layout with slots in order
    inside each expert (the atomic dispatch may order an expert's rows differently)."""
    flat = ids.reshape(-1).to(torch.int64).cpu()
    n = flat.numel()
    valid = (flat >= 0) & (flat < n_experts)
    if dispatch in SLOT_BLOCKS:
        slots = torch.arange(n)
        sorted_ = torch.full((n, bm), n, dtype=torch.int32)
        sorted_[valid, 0] = slots[valid].to(torch.int32)
        pos = torch.where(valid, slots * bm, n * bm).to(torch.int32)
        bexp = torch.where(valid, flat, n_experts).to(torch.int32)
        return sorted_.reshape(-1), pos, bexp
    mb = n_blocks(n, n_experts, bm)
    counts = torch.bincount(flat[valid], minlength=n_experts)
    blocks = (counts + bm - 1) // bm
    block_end = torch.cumsum(blocks, 0)
    row_start = (block_end - blocks) * bm
    sorted_ = torch.full((mb * bm,), n, dtype=torch.int32)
    pos = torch.full((n,), mb * bm, dtype=torch.int32)
    seen = torch.zeros(n_experts, dtype=torch.int64)
    for s in range(n):
        if valid[s]:
            e = int(flat[s])
            p = int(row_start[e] + seen[e])
            seen[e] += 1
            sorted_[p] = s
            pos[s] = p
    b = torch.arange(mb)
    bexp = (block_end.view(1, -1) <= b.view(-1, 1)).sum(1).clamp(max=n_experts).to(torch.int32)
    return sorted_, pos, bexp


def _check_experts(hidden, ids, weights, gate_up, down, residual) -> None:
    """One clear ValueError for inputs the kernels do not take."""
    tensors = {"hidden": hidden, "ids": ids, "weights": weights, "gate_up": gate_up, "down": down}
    if residual is not None:
        tensors["residual"] = residual
    for name, t in tensors.items():
        if not t.is_cuda:
            raise ValueError(f"{name} must be a CUDA tensor, got {t.device}")
    if hidden.dtype not in _DTYPES:
        raise ValueError(f"hidden dtype {hidden.dtype} is not supported (bfloat16, float16)")
    if gate_up.dtype != hidden.dtype or down.dtype != hidden.dtype:
        raise ValueError("gate_up and down must have the hidden dtype")
    if hidden.dim() != 2 or ids.dim() != 2 or weights.shape != ids.shape:
        raise ValueError("hidden must be [T, H], ids and weights [T, k]")
    t, h = hidden.shape
    if ids.shape[0] != t:
        raise ValueError(f"ids has {ids.shape[0]} rows for {t} tokens")
    if ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"ids dtype {ids.dtype} must be int32 or int64")
    if gate_up.dim() != 3 or gate_up.shape[2] != h or gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must be [E, 2I, {h}], got {tuple(gate_up.shape)}")
    e, i2, _ = gate_up.shape
    if tuple(down.shape) != (e, h, i2 // 2):
        raise ValueError(f"down must be [{e}, {h}, {i2 // 2}], got {tuple(down.shape)}")
    if gate_up.stride(2) != 1 or down.stride(2) != 1:
        raise ValueError("expert weights must be contiguous along their last dim")
    if residual is not None and residual.shape != hidden.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} != {tuple(hidden.shape)}")


def _rows(t: torch.Tensor) -> torch.Tensor:
    """A 2-D tensor with unit column stride and dense rows (what the kernels index)."""
    return (
        t
        if t.stride(-1) == 1 and (t.shape[0] <= 1 or t.stride(0) == t.shape[1])
        else (t.contiguous())
    )


def moe_experts(
    hidden: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    residual: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    config: MoeConfig | None = None,
) -> torch.Tensor:
    """``(residual +) sum_j weights[:, j] * expert_{ids[:, j]}(hidden)`` -> [T, H].

    gate_up [E, 2I, H] (gate rows, then up rows), down [E, H, I] as `Qwen3MoeExperts` stores
    them. `out` (contiguous [T, H]) receives the result when given; `config` overrides
    `choose_config` (benchmark sweeps, tests).
    """
    _check_experts(hidden, ids, weights, gate_up, down, residual)
    t, h = hidden.shape
    n_experts, i2, _ = gate_up.shape
    inter = i2 // 2
    top_k = ids.shape[1]
    if out is None:
        out = torch.empty_like(hidden, memory_format=torch.contiguous_format)
    if t == 0:
        return out
    n = t * top_k
    cfg = config or choose_config(n, n_experts)
    flat = ids.reshape(-1)
    flat = flat if flat.dtype == torch.int32 and flat.is_contiguous() else flat.int().contiguous()
    if cfg.dispatch == "direct":
        rows = n * cfg.bm
        act, y = _workspace(rows, inter, h, hidden)
        direct_gate_up_silu(_rows(hidden), flat, gate_up, top_k, cfg, act)
        grouped_down(act, flat, down, cfg, y)
        return combine(y, flat.view(t, top_k), weights, residual, out, n_experts, cfg.bm)
    sorted_, pos, bexp = moe_dispatch(flat, n_experts, cfg.bm, cfg.dispatch)
    act, y = _workspace(sorted_.numel(), inter, h, hidden)
    grouped_gate_up_silu(_rows(hidden), sorted_, bexp, gate_up, top_k, cfg, act)
    grouped_down(act, bexp, down, cfg, y)
    return combine(y, pos.view(t, top_k), weights, residual, out)


def _workspace(rows: int, inter: int, h: int, like: torch.Tensor):
    """The activation ``[rows, inter]`` and expert-output ``[rows, h]`` rows, one allocation."""
    buf = torch.empty(rows * (inter + h), dtype=like.dtype, device=like.device)
    return buf[: rows * inter].view(rows, inter), buf[rows * inter :].view(rows, h)


def grouped_gate_up_silu(
    hidden: torch.Tensor,
    sorted_: torch.Tensor,
    bexp: torch.Tensor,
    gate_up: torch.Tensor,
    top_k: int,
    cfg: MoeConfig,
    act: torch.Tensor,
) -> torch.Tensor:
    """Stage 1 of `moe_experts`: ``act[r] = silu(g) * u`` for each padded row r of the
    dispatch (``[g; u] = gate_up[e] @ hidden[slot // top_k]``), rows in expert order."""
    s = stream(act.device)
    h = hidden.shape[1]
    xs = hidden.new_empty((sorted_.numel(), h))
    th = gather_tile(h)
    args = (hidden, sorted_, bexp, xs, top_k, gate_up.shape[0], cfg.bm, th)
    ct.launch(s, (bexp.numel(), math.ceil(h / th), 1), tilegym_moe_gather_rows_kernel, args)
    _launch_gate_up(xs, bexp, gate_up, act, cfg, 0)
    return act


def direct_gate_up_silu(
    hidden: torch.Tensor,
    flat_ids: torch.Tensor,
    gate_up: torch.Tensor,
    top_k: int,
    cfg: MoeConfig,
    act: torch.Tensor,
) -> torch.Tensor:
    """Stage 1 of the ``direct`` dispatch: ``act[s * bm]`` for each slot s (its other bm - 1
    rows zero), the token row read by the GEMM itself."""
    return _launch_gate_up(hidden, flat_ids, gate_up, act, cfg, top_k)


def _launch_gate_up(xs, bexp, gate_up, act, cfg: MoeConfig, direct_k: int) -> torch.Tensor:
    inter = gate_up.shape[1] // 2
    args = (xs, bexp, gate_up[:, :inter], gate_up[:, inter:], act, cfg.bm, cfg.bn_up, cfg.tk)
    grid = (bexp.numel(), math.ceil(inter / cfg.bn_up), 1)
    kernel = _hinted(tilegym_moe_gate_up_kernel, cfg)
    ct.launch(stream(act.device), grid, kernel, (*args, cfg.swap, direct_k))
    return act


def grouped_down(
    act: torch.Tensor, bexp: torch.Tensor, down: torch.Tensor, cfg: MoeConfig, y: torch.Tensor
) -> torch.Tensor:
    """Stage 2: ``y[r] = down[e] @ act[r]`` for each padded row r of expert e's blocks."""
    args = (act, bexp, down, y, cfg.bm, cfg.bn_down, cfg.tk, cfg.swap)
    grid = (bexp.numel(), math.ceil(down.shape[1] / cfg.bn_down), 1)
    ct.launch(stream(y.device), grid, _hinted(tilegym_moe_down_kernel, cfg), args)
    return y


def combine(
    y: torch.Tensor,
    pos: torch.Tensor,
    weights: torch.Tensor,
    residual: torch.Tensor | None,
    out: torch.Tensor,
    n_experts: int = 0,
    direct_bm: int = 0,
) -> torch.Tensor:
    """Stage 3: ``out[t] = (residual[t] +) sum_j weights[t, j] * y[pos[t, j]]``, in fp32 and
    in slot order (deterministic: no float atomics). ``direct_bm`` > 0: ``pos`` holds the
    expert ids and slot s's row is ``s * direct_bm`` (missing for ids outside the
    ``n_experts``)."""
    t, top_k = pos.shape
    h = y.shape[1]
    tt, kp, th = combine_tiles(top_k, h)
    res = _rows(residual) if residual is not None else out
    consts = (tt, kp, th, residual is not None, direct_bm)
    args = (y, pos, _rows(weights), res, out, n_experts, *consts)
    grid = (math.ceil(t / tt), math.ceil(h / th), 1)
    ct.launch(stream(out.device), grid, tilegym_moe_combine_kernel, args)
    return out


def moe_experts_reference(
    hidden: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """`Qwen3MoeExperts.forward` (+ residual) in fp32 (returned fp32); ids outside the
    experts contribute nothing, as transformers skips its expert-parallel sentinel."""
    x = hidden.float()
    inter = down.shape[-1]
    out = torch.zeros_like(x) if residual is None else residual.float().clone()
    ids64 = ids.to(torch.int64)
    for e in range(gate_up.shape[0]):
        tok, slot = torch.where(ids64 == e)
        if tok.numel() == 0:
            continue
        gu = x[tok] @ gate_up[e].float().T
        act = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        contrib = (act @ down[e].float().T) * weights[tok, slot].float().unsqueeze(-1)
        out.index_add_(0, tok, contrib)
    return out


# ---------------------------------------------------------------------------------------------
# AOT signatures
# ---------------------------------------------------------------------------------------------


#: Qwen3-30B-A3B: hidden 2048, moe_intermediate_size 768, 128 experts, 8 per token
QWEN3_30B_A3B = dict(hidden=2048, inter=768, experts=128, top_k=8)


def aot_signatures(
    experts: int = QWEN3_30B_A3B["experts"],
    top_k: int = QWEN3_30B_A3B["top_k"],
    hidden: int = QWEN3_30B_A3B["hidden"],
    tokens: tuple[int, ...] = (1, 8, 128, 256, 512, 2048),
    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,),
    configs: tuple[MoeConfig, ...] = (),
) -> dict:
    """`{kernel: [KernelSignature, ...]}` for every kernel here: the router (logits in each
    dtype and fp32), the dispatch kernels and the GEMM/combine tiles `choose_config` picks at
    ``tokens`` (decode, the middle buckets and prefill)."""
    i32, n_int = aligned_array_sig(ct.int32, 1), ScalarConstraint(ct.int32)
    ep, chunk = dispatch_tiles(experts)
    cfgs = {choose_config(t * top_k, experts) for t in tokens} | set(configs)
    # a slot-block config's tiles under either slot-block dispatch (benchmarks compare them)
    cfgs |= {replace(c, dispatch=d) for c in cfgs if c.dispatch in SLOT_BLOCKS for d in SLOT_BLOCKS}
    cfgs = sorted(cfgs, key=lambda c: (c.bm, c.bn_up, c.bn_down, c.tk, repr(c)))
    sigs: dict = {}

    def add(kernel, *params):
        sig = signature(*params)
        if sig not in sigs.setdefault(kernel, []):
            sigs[kernel].append(sig)

    tm, ep_route, kp = route_tiles(experts, top_k)
    for dt in (*dtypes, torch.float32):
        logits = aligned_array_sig(_CT[dt], 2)
        for norm in (True, False):
            for rows in sorted({1, tm}):  # `route_rows`: one row a program at decode
                consts = (rows, ep_route, top_k, kp, norm, ROUTE_PACKED)
                ids = aligned_array_sig(ct.int32, 2)
                add(tilegym_moe_route_kernel, logits, logits, ids, *consts)
    for cfg in cfgs:
        if cfg.dispatch == "per_slot":
            for t in tokens:
                if t * top_k <= PER_SLOT_MAX:
                    consts = (cfg.bm, per_slot_tile(t * top_k))
                    add(tilegym_moe_dispatch_per_slot_kernel, i32, i32, i32, i32, n_int, *consts)
        else:
            add(tilegym_moe_count_kernel, i32, i32, i32, i32, SLOT_TILE)
            add(tilegym_moe_scan_kernel, i32, i32, i32, cfg.bm, ep, chunk)
            add(tilegym_moe_scatter_kernel, i32, i32, i32, i32, i32, SLOT_TILE)
    combine = combine_tiles(top_k, hidden)
    th = gather_tile(hidden)
    for dt in dtypes:
        a2, a3 = aligned_array_sig(_CT[dt], 2), aligned_array_sig(_CT[dt], 3)
        for cfg in cfgs:
            direct = cfg.dispatch == "direct"
            if not direct:
                add(tilegym_moe_gather_rows_kernel, a2, i32, i32, a2, n_int, n_int, cfg.bm, th)
            tiles = (cfg.bm, cfg.bn_up, cfg.tk, cfg.swap, top_k if direct else 0)
            add(_hinted(tilegym_moe_gate_up_kernel, cfg), a2, i32, a3, a3, a2, *tiles)
            tiles = (cfg.bm, cfg.bn_down, cfg.tk, cfg.swap)
            add(_hinted(tilegym_moe_down_kernel, cfg), a2, i32, a3, a2, *tiles)
        direct_bms = {cfg.bm if cfg.dispatch == "direct" else 0 for cfg in cfgs}
        # routing weights in the activation dtype (Qwen3-MoE) or in fp32 (DeepSeek's routers)
        weight_sigs = (a2, aligned_array_sig(ct.float32, 2))
        for has_res in (True, False):
            for direct_bm in sorted(direct_bms):
                pos = aligned_array_sig(ct.int32, 2)
                consts = (*combine, has_res, direct_bm)
                for wts in weight_sigs:
                    add(tilegym_moe_combine_kernel, a2, pos, wts, a2, a2, n_int, *consts)
    return sigs


__all__ = [
    "MoeConfig",
    "aot_signatures",
    "choose_config",
    "dispatch_reference",
    "moe_dispatch",
    "n_blocks",
    "moe_experts",
    "moe_experts_reference",
    "moe_route",
    "moe_route_reference",
]
