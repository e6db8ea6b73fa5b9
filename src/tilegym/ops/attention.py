"""cuTile attention kernels: flash-style prefill and split-KV decode, with PyTorch references.

Decode blocks over (batch*kv head, key split) share each K/V tile among the query heads of a GQA
group. ``plan_decode`` picks the launch (``DECODE_MODE``): short caches run one block per
(batch, kv head) over the whole cache with a large key tile (no combine), as do long caches
when the batch alone gives enough blocks; the rest split the keys and combine the partial results
in a reduction kernel launched as a programmatic dependent (``pdl``).

Layouts follow transformers' attention functions: queries ``[B, Hq, Sq, D]`` and keys/values
``[B, Hkv, Skv, D]`` (any strides with a unit last stride, e.g. the transposed projections or a
slice of a preallocated cache). Grouped-query attention maps query head ``h`` to key/value head
``h // (Hq // Hkv)``.

Masking is described compactly instead of as a dense ``[B, 1, Sq, Skv]`` tensor:

- ``q_start``: key index aligned with query row 0. Causal lets query row ``i`` see keys
  ``j <= i + q_start`` (``Skv - Sq`` for a cache that ends with the new tokens).
- ``window``: sliding window; additionally ``j > i + q_start - window``.
- ``key_valid``: optional ``[B, Skv]`` per-key validity (transformers' 2D padding mask).
- ``kv_lens`` (decode only): optional per-sequence number of valid keys from index 0.
- ``position`` (decode only): a one-element int32 device tensor holding the new token's cache
  index; every sequence sees keys ``[0, position]``. A static cache's decode step reads it on
  the device, so one captured CUDA graph serves every step.

Query rows that can see no key (left-padding rows) produce zeros.

Head dims (``KERNEL_HEAD_DIMS``): 64, 96, 128 and 256. 96 (Phi-3.5-mini) runs in 128-wide
tiles (``head_tile``): loads zero-fill the columns past 96, so ``q @ k^T`` is unchanged, and
stores drop them. 256 (gemma-3-1b) uses smaller key/query tiles. The model patch serves
``SUPPORTED_HEAD_DIMS``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import cuda.tile as ct
import torch
from cuda.tile import RoundingMode as RMd

from tilegym.ops._common import buffers_private, sm_count, stream, with_occupancy

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

LOG2E = 1.0 / math.log(2.0)
_NEG_BIG = -1.0e30  # finite "minus infinity" for running maxima: keeps fully masked rows NaN-free
KERNEL_HEAD_DIMS = (64, 96, 128, 256)
"""Head dims the kernels accept, each checked against fp32 on an H200."""
SUPPORTED_HEAD_DIMS = KERNEL_HEAD_DIMS
"""Head dims the model patch hands to these kernels (all of them)."""
_ZERO = ct.PaddingMode.ZERO


class AttentionInputError(ValueError):
    """Inputs outside the envelope the cuTile attention kernels support."""


def head_tile(head_dim: int) -> int:
    """Tile extent over the head dim (the kernels' ``D``): tile extents are powers of two, so
    96 runs 128 wide; loads zero-fill past the array's last column and stores skip it."""
    return _next_pow2(head_dim)


# --------------------------------------------------------------------------------------------
# Prefill
# --------------------------------------------------------------------------------------------


@ct.kernel(occupancy=1)
def prefill_attention_kernel(
    Q,
    K,
    V,
    Out,
    KeyValid,
    qk_scale: float,
    q_start: int,
    window: int,
    D: ConstInt,
    HQ: ConstInt,
    GROUP: ConstInt,
    TILE_M: ConstInt,
    TILE_N: ConstInt,
    CAUSAL: ConstBool,
    SLIDING: ConstBool,
    HAS_PAD: ConstBool,
):
    """One (query tile, batch*head) block: online softmax over the key tiles it can see."""
    num_m = ct.num_blocks(0)
    bm = num_m - 1 - ct.bid(0)  # heaviest causal tiles first
    bh = ct.bid(1)
    b = bh // HQ
    h = bh % HQ
    hk = h // GROUP
    skv = K.shape[2]

    q_lo = bm * TILE_M
    rows = q_lo + q_start + ct.arange(TILE_M, dtype=ct.int32)[:, None]
    col_tile = ct.arange(TILE_N, dtype=ct.int32)[None, :]

    q = ct.load(Q, index=(b, h, bm, 0), shape=(1, 1, TILE_M, D), padding_mode=_ZERO)
    q = q.reshape((TILE_M, D))

    m_i = ct.full((TILE_M, 1), _NEG_BIG, dtype=ct.float32)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    acc = ct.full((TILE_M, D), 0.0, dtype=ct.float32)

    # Key tiles [j_lo, j_hi) may be visible; tiles in [j_full_lo, j_full_hi) need no mask.
    kv_hi = skv
    j_full_hi = skv // TILE_N
    if CAUSAL:
        kv_hi = min(skv, q_lo + q_start + TILE_M)
        j_full_hi = min(j_full_hi, (q_lo + q_start + 1) // TILE_N)
    j_hi = ct.cdiv(kv_hi, TILE_N)
    j_lo = 0
    j_full_lo = 0
    if SLIDING:
        j_lo = max(0, q_lo + q_start - window + 1) // TILE_N
        j_full_lo = max(0, ct.cdiv(q_lo + q_start + TILE_M - window, TILE_N))

    for j in range(j_lo, j_hi):
        k = ct.load(
            K,
            index=(b, hk, 0, j),
            shape=(1, 1, D, TILE_N),
            order=(0, 1, 3, 2),
            padding_mode=_ZERO,
            latency=2,
        ).reshape((D, TILE_N))
        qk = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
        qk = ct.mma(q, k, qk)

        if HAS_PAD or j >= j_full_hi or j < j_full_lo:
            cols = j * TILE_N + col_tile
            ok = cols < skv
            if CAUSAL:
                ok = ok & (cols <= rows)
            if SLIDING:
                ok = ok & (cols > rows - window)
            if HAS_PAD:
                kv_ok = ct.load(KeyValid, index=(b, j), shape=(1, TILE_N), padding_mode=_ZERO)
                ok = ok & (kv_ok != 0)
            qk = ct.where(ok, qk, -math.inf)

        m_new = ct.maximum(m_i, ct.max(qk, axis=-1, keepdims=True) * qk_scale)
        p = ct.exp2(qk * qk_scale - m_new, flush_to_zero=True)
        alpha = ct.exp2(m_i - m_new, flush_to_zero=True)
        l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
        acc = acc * alpha
        v = ct.load(
            V, index=(b, hk, j, 0), shape=(1, 1, TILE_N, D), padding_mode=_ZERO, latency=4
        ).reshape((TILE_N, D))
        acc = ct.mma(p.astype(Q.dtype), v, acc)
        m_i = m_new

    l_safe = ct.where(l_i == 0.0, 1.0, l_i)
    acc = ct.truediv(acc, l_safe, flush_to_zero=True, rounding_mode=RMd.APPROX)
    ct.store(Out, index=(b, h, bm, 0), tile=acc.reshape((1, 1, TILE_M, D)).astype(Out.dtype))


@dataclass(frozen=True)
class PrefillConfig:
    """Tile shape and occupancy of the prefill kernel."""

    tile_m: int
    tile_n: int
    occupancy: int = 1


def default_prefill_config(head_dim: int) -> PrefillConfig:
    """Tile choice per head dim (64 and 128 measured on H200, see
    benchmarks/ops/bench_attention.py; 96 runs as 128). 256 is not measured: half the key tile
    keeps 128's K/V tile bytes, one block per SM for the larger accumulator; on sm_90 it
    compiles with an 8-24 byte stack frame (64 keys: 56-80 bytes, 128 queries: 1.5 KiB)."""
    if head_dim <= 64:
        return PrefillConfig(tile_m=128, tile_n=128, occupancy=2)
    if head_dim <= 128:
        return PrefillConfig(tile_m=64, tile_n=64, occupancy=2)
    return PrefillConfig(tile_m=64, tile_n=32, occupancy=1)


_dummy_masks: dict[torch.device, torch.Tensor] = {}


def _dummy_mask(device: torch.device) -> torch.Tensor:
    """Placeholder key-validity mask (never read); per call inside ``private_buffers()``."""
    if buffers_private():
        return torch.empty((1, 128), dtype=torch.int8, device=device)
    t = _dummy_masks.get(device)
    if t is None:
        t = torch.ones((1, 128), dtype=torch.int8, device=device)
        _dummy_masks[device] = t
    return t


_dummy_sink_arrays: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _dummy_sinks(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Placeholder sinks of the decode kernel (read by ``EPI_SINK`` only); per call inside
    ``private_buffers()``."""
    if buffers_private():
        return torch.empty((1,), dtype=dtype, device=device)
    t = _dummy_sink_arrays.get((device, dtype))
    if t is None:
        t = torch.zeros((1,), dtype=dtype, device=device)
        _dummy_sink_arrays[(device, dtype)] = t
    return t


def _check_head_dim(head_dim: int) -> None:
    if head_dim not in KERNEL_HEAD_DIMS:
        raise AttentionInputError(
            f"head_dim {head_dim} not supported (supported: {KERNEL_HEAD_DIMS})"
        )


def _check_common(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int]:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise AttentionInputError("query, key and value must be 4D [batch, heads, seq, head_dim]")
    b, hq, _, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise AttentionInputError(
            f"key/value shapes {tuple(k.shape)}/{tuple(v.shape)} do not fit query {tuple(q.shape)}"
        )
    _check_head_dim(d)
    hkv = k.shape[1]
    if hq % hkv:
        raise AttentionInputError(f"{hq} query heads are not a multiple of {hkv} key/value heads")
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise AttentionInputError(f"dtypes {q.dtype}/{k.dtype}/{v.dtype}: need one of bf16/fp16")
    if not q.is_cuda:
        raise AttentionInputError("cuTile attention needs CUDA tensors")
    return b, hq, hkv


def _unit_last_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def aligned_key_valid(key_valid: torch.Tensor) -> torch.Tensor:
    """int8 ``[B, S]`` view whose rows start 16-byte aligned, as tile loads want them."""
    b, s = key_valid.shape
    if key_valid.dtype == torch.int8 and key_valid.stride(1) == 1 and key_valid.stride(0) % 16 == 0:
        return key_valid
    buf = torch.empty((b, -(-s // 16) * 16), dtype=torch.int8, device=key_valid.device)
    buf[:, :s] = key_valid
    return buf[:, :s]


def _key_valid_arg(key_valid: torch.Tensor | None, b: int, skv: int) -> torch.Tensor | None:
    if key_valid is None:
        return None
    if key_valid.shape != (b, skv):
        raise AttentionInputError(f"key_valid shape {tuple(key_valid.shape)} != {(b, skv)}")
    return aligned_key_valid(key_valid)


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = True,
    q_start: int | None = None,
    window: int | None = None,
    key_valid: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: PrefillConfig | None = None,
) -> torch.Tensor:
    """Flash attention forward; returns ``[B, Sq, Hq, D]`` (transformers' output layout)."""
    b, hq, hkv = _check_common(q, k, v)
    sq, d = q.shape[2], q.shape[3]
    skv = k.shape[2]
    if q_start is None:
        q_start = skv - sq
    if causal and q_start < 0:
        raise AttentionInputError(f"causal attention needs q_start >= 0, got {q_start}")
    if window is not None and window <= 0:
        raise AttentionInputError(f"sliding window must be positive, got {window}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    cfg = config or default_prefill_config(d)
    q, k, v = _unit_last_stride(q), _unit_last_stride(k), _unit_last_stride(v)
    kv_arg = _key_valid_arg(key_valid, b, skv)
    if out is None:
        out = torch.empty((b, sq, hq, d), dtype=q.dtype, device=q.device)
    grid = (ct.cdiv(sq, cfg.tile_m), b * hq, 1)
    ct.launch(
        stream(),
        grid,
        with_occupancy(prefill_attention_kernel, cfg.occupancy, 1),
        (
            q,
            k,
            v,
            out.transpose(1, 2),
            kv_arg if kv_arg is not None else _dummy_mask(q.device),
            scale * LOG2E,
            int(q_start),
            int(window or 0),
            head_tile(d),
            hq,
            hq // hkv,
            cfg.tile_m,
            cfg.tile_n,
            bool(causal),
            window is not None,
            kv_arg is not None,
        ),
    )
    return out


# --------------------------------------------------------------------------------------------
# Decode (one query token per sequence), split over the key/value length
# --------------------------------------------------------------------------------------------

LENS_NONE = 0
"""Decode key range: ``[0, kv_end)`` for every sequence (a launch argument)."""
LENS_PER_SEQUENCE = 1
"""Decode key range: ``[0, kv_lens[b])``, read on the device."""
LENS_POSITION = 2
"""Decode key range: ``[0, min(position[0], T - 1)]`` for every sequence, read on the device
(static cache; a position past the cache's ``T`` slots, a ring buffer's, sees all of them)."""

EPI_OUT = 0
"""Decode epilogue: one split, normalize and write the output."""
EPI_PARTS = 1
"""Decode epilogue: write the split's partial output and log-sum-exp for the reduction kernel."""
EPI_SINK = 2
"""Decode epilogue: one split, the head's sink logit (``Sinks``) joins the softmax denominator,
then write the output (``tilegym.ops.attention_sinks``: no partials, no reduction kernel)."""
DECODE_ROWS_GP = 64
"""Query rows of the ``rows`` form (the group's heads, zero-padded to one 64-row MMA tile)."""


def _decode_cols(Qg, K, V, KeyValid, b, hk, j0, j1, start, end, qk_scale, D, GP, TILE_N, PAD, LENS):
    """Online softmax over key tiles [j0, j1) with the keys on the MMA rows: ``K @ q^T`` is
    ``(TILE_N, GP)``, so a tile needs only ``GP`` (>= 8) query columns; the softmax reduces over
    the rows. Returns the normalized output ``(GP, D)`` and the log2-sum-exp ``(GP, 1)``."""
    q = ct.load(Qg, index=(b, hk, 0, 0), shape=(1, 1, GP, D), padding_mode=_ZERO)
    q_t = ct.transpose(q.reshape((GP, D)))  # (D, GP)
    offs = ct.arange(TILE_N, dtype=ct.int32)[:, None]
    m_i = ct.full((1, GP), _NEG_BIG, dtype=ct.float32)
    l_i = ct.full((1, GP), 0.0, dtype=ct.float32)
    acc = ct.full((D, GP), 0.0, dtype=ct.float32)
    for j in range(j0, j1):
        k = ct.load(
            K, index=(b, hk, j, 0), shape=(1, 1, TILE_N, D), padding_mode=_ZERO, latency=4
        ).reshape((TILE_N, D))
        qk = ct.mma(k, q_t, ct.full((TILE_N, GP), 0.0, dtype=ct.float32))
        cols = j * TILE_N + offs
        ok = (cols < end) & (cols >= start)
        if PAD:
            kv_ok = ct.load(KeyValid, index=(b, j), shape=(1, TILE_N), padding_mode=_ZERO)
            ok = ok & (kv_ok.reshape((TILE_N, 1)) != 0)
        qk = ct.where(ok, qk * qk_scale, -math.inf)
        m_new = ct.maximum(m_i, ct.max(qk, axis=0, keepdims=True))
        p = ct.exp2(qk - m_new, flush_to_zero=True)
        alpha = ct.exp2(m_i - m_new, flush_to_zero=True)
        l_i = l_i * alpha + ct.sum(p, axis=0, keepdims=True)
        acc = acc * alpha
        v = ct.load(
            V, index=(b, hk, j, 0), shape=(1, 1, TILE_N, D), padding_mode=_ZERO, latency=4
        ).reshape((TILE_N, D))
        if LENS:
            v = ct.where(ok, v, 0.0)  # keys past a sequence's length may hold stale data
        acc = ct.mma(ct.transpose(v), p.astype(V.dtype), acc)
        m_i = m_new
    l_safe = ct.where(l_i == 0.0, 1.0, l_i)
    o = ct.transpose(acc / l_safe)  # (GP, D)
    lse = ct.where(l_i == 0.0, -math.inf, m_i + ct.log2(l_safe))
    return o, lse.reshape((GP, 1))


def _decode_rows(Qg, K, V, KeyValid, b, hk, j0, j1, start, end, qk_scale, D, GP, TILE_N, PAD, LENS):
    """Online softmax with the group's query heads on the MMA rows (zero-padded to ``GP``):
    ``q @ K^T`` is ``(GP, TILE_N)`` and the softmax reduces along each row (no cross-warp
    reduction), at the price of MMA work on the padding rows. Same results as ``_decode_cols``."""
    q = ct.load(Qg, index=(b, hk, 0, 0), shape=(1, 1, GP, D), padding_mode=_ZERO)
    q = q.reshape((GP, D))
    offs = ct.arange(TILE_N, dtype=ct.int32)[None, :]
    m_i = ct.full((GP, 1), _NEG_BIG, dtype=ct.float32)
    l_i = ct.full((GP, 1), 0.0, dtype=ct.float32)
    acc = ct.full((GP, D), 0.0, dtype=ct.float32)
    for j in range(j0, j1):
        k = ct.load(
            K, index=(b, hk, j, 0), shape=(1, 1, TILE_N, D), padding_mode=_ZERO, latency=4
        ).reshape((TILE_N, D))
        qk = ct.mma(q, ct.transpose(k), ct.full((GP, TILE_N), 0.0, dtype=ct.float32))
        cols = j * TILE_N + offs
        ok = (cols < end) & (cols >= start)
        if PAD:
            kv_ok = ct.load(KeyValid, index=(b, j), shape=(1, TILE_N), padding_mode=_ZERO)
            ok = ok & (kv_ok != 0)
        qk = ct.where(ok, qk * qk_scale, -math.inf)
        m_new = ct.maximum(m_i, ct.max(qk, axis=1, keepdims=True))
        p = ct.exp2(qk - m_new, flush_to_zero=True)
        alpha = ct.exp2(m_i - m_new, flush_to_zero=True)
        l_i = l_i * alpha + ct.sum(p, axis=1, keepdims=True)
        acc = acc * alpha
        v = ct.load(
            V, index=(b, hk, j, 0), shape=(1, 1, TILE_N, D), padding_mode=_ZERO, latency=4
        ).reshape((TILE_N, D))
        if LENS:
            v = ct.where(ct.transpose(ok), v, 0.0)  # keys past a length may hold stale data
        acc = ct.mma(p.astype(V.dtype), v, acc)
        m_i = m_new
    l_safe = ct.where(l_i == 0.0, 1.0, l_i)
    lse = ct.where(l_i == 0.0, -math.inf, m_i + ct.log2(l_safe))
    return acc / l_safe, lse


@ct.kernel
def decode_attention_kernel(
    Qg,
    K,
    V,
    OPart,
    LsePart,
    Out,
    KeyValid,
    KvLens,
    Sinks,
    qk_scale: float,
    kv_end: int,
    window: int,
    tiles_per_split: int,
    D: ConstInt,
    GP: ConstInt,
    TILE_N: ConstInt,
    SLIDING: ConstBool,
    HAS_PAD: ConstBool,
    LENS: ConstInt,
    ROWS: ConstBool,
    EPI: ConstInt,
):
    """One (batch*kv head, split) block: all query heads of the group against one key range.

    ``ROWS`` picks the MMA orientation (``_decode_rows`` / ``_decode_cols``), ``EPI`` what the
    block writes (``EPI_OUT``: the output; ``EPI_PARTS``: partials for ``decode_reduce_kernel``;
    ``EPI_SINK``: the output with the sinks ``[Hq]`` in the denominator; only that one reads
    ``Sinks``).
    """
    hkv = K.shape[1]
    bh = ct.bid(0)
    s = ct.bid(1)
    b = bh // hkv
    hk = bh % hkv

    end = kv_end
    if LENS == LENS_PER_SEQUENCE:
        end = ct.gather(KvLens, b)
    if LENS == LENS_POSITION:  # a ring buffer's position may lie past its last slot
        end = ct.minimum(ct.gather(KvLens, 0) + 1, K.shape[2])
    start = end * 0
    if SLIDING:
        start = ct.maximum(end - window, 0)
    j0 = start // TILE_N + s * tiles_per_split
    j1 = ct.minimum(j0 + tiles_per_split, ct.cdiv(end, TILE_N))

    args = (Qg, K, V, KeyValid, b, hk, j0, j1, start, end, qk_scale, D, GP, TILE_N)
    if ROWS:
        o, lse = _decode_rows(*args, HAS_PAD, LENS != LENS_NONE)
    else:
        o, lse = _decode_cols(*args, HAS_PAD, LENS != LENS_NONE)

    if EPI == EPI_SINK:
        # o * 2^lse / (2^lse + 2^sink): no visible key (lse = -inf, o = 0) gives 0
        heads = hk * Qg.shape[2] + ct.arange(GP, dtype=ct.int32)  # padding rows: not stored
        sink = ct.astype(ct.gather(Sinks, heads), ct.float32).reshape((GP, 1)) * LOG2E
        o = o / (1.0 + ct.exp2(sink - lse))
    if EPI != EPI_PARTS:
        ct.store(Out, index=(b, hk, 0, 0), tile=o.reshape((1, 1, GP, D)).astype(Out.dtype))
    else:
        ct.store(OPart, index=(b, hk, 0, s, 0), tile=o.reshape((1, 1, GP, 1, D)))
        ct.store(LsePart, index=(b, hk, 0, s), tile=lse.reshape((1, 1, GP, 1)))


@ct.kernel
def decode_reduce_kernel(OPart, LsePart, Out, D: ConstInt, NSP: ConstInt, PDL: ConstBool):
    """Combine the per-split partial outputs of one (batch, query head) by their log-sum-exp.

    With ``PDL`` it is launched as a programmatic dependent of the split kernel: its blocks start
    while the split kernel drains and wait here until the partial results are visible.
    """
    r = ct.bid(0)
    if PDL:
        ct.grid_dependency_control_wait()
    lse = ct.load(LsePart, index=(r, 0), shape=(1, NSP), padding_mode=ct.PaddingMode.NEG_INF)
    lse = lse.reshape((NSP, 1))
    o = ct.load(OPart, index=(r, 0, 0), shape=(1, NSP, D), padding_mode=_ZERO).reshape((NSP, D))
    m = ct.max(lse, axis=0, keepdims=True)
    m = ct.where(m == -math.inf, 0.0, m)
    w = ct.exp2(lse - m, flush_to_zero=True)
    den = ct.sum(w, axis=0, keepdims=True)
    num = ct.sum(o * w, axis=0, keepdims=True)
    out = num / ct.where(den == 0.0, 1.0, den)
    ct.store(Out, index=(r, 0), tile=out.astype(Out.dtype))


DECODE_MODES = ("auto", "pdl", "split")
DECODE_MODE = "auto"
"""Default decode launch scheme (one-line switch), see ``plan_decode``: ``pdl`` = split kernel +
reduction kernel launched as its programmatic dependent; ``split`` = split kernel + plain
reduction launch; ``auto`` = one split with a large key tile when the cache is short
(``DECODE_AUTO_ONE_SPLIT_KEYS``) or the batch gives enough blocks
(``DECODE_AUTO_ONE_SPLIT_BLOCKS``), else ``DECODE_AUTO_SCHEME`` with the auto split plan. Chosen
from the H200 decode sweep (docs/results/h200-2026-11-29/ops/attention_decode_auto.txt)."""
DECODE_AUTO_SCHEME = "pdl"
"""Launch scheme ``auto`` uses when it splits the keys."""
DECODE_AUTO_ONE_SPLIT_KEYS = 512
"""``auto`` runs one block per (batch, kv head) over the whole cache up to this many keys..."""
DECODE_AUTO_ONE_SPLIT_BLOCKS = 64
"""...and at any length once batch * kv heads reaches this many blocks (half the H200's SMs):
the H200 sweep had one split with 256-key tiles beat every split plan at batch 8 up to 8K keys."""
DECODE_AUTO_SPLIT_WAVES = 2
DECODE_AUTO_OCCUPANCY = 2
"""Split plan of ``auto`` when it splits (few blocks, long cache): two blocks per SM."""
DECODE_ONE_SPLIT_TILE_KEYS = 256
"""Largest key tile of a one-split launch (the cache is covered in as few tiles as possible) up
to head_dim 128; ``one_split_tile_n`` keeps its 64 KiB K tile bytes at larger head dims."""
DECODE_FORMS = ("cols", "rows")
DECODE_FORM = "cols"
"""MMA orientation (``_decode_cols``: keys on the MMA rows; ``_decode_rows``: query heads)."""
DECODE_TILE_N = 64
"""Keys per tile for head_dim 128 (16 KiB of K per load); head_dim 64 uses twice as many, 256
as many (``default_decode_tile_n``)."""
DECODE_SPLIT_WAVES = 1
"""Target blocks per SM when choosing the number of key splits. With 16-byte aligned strides the
decode kernels compile to warp-specialized TMA pipelines using ~150-220 KiB of shared memory, i.e.
one resident block per SM: one wave of <= #SMs blocks avoids a serialized second wave."""
DECODE_MIN_SPLIT_KEYS = 128
"""Fewest keys a split gets (short caches use fewer, longer splits; 1 split = no combine)."""
DECODE_MAX_SPLITS = 64
DECODE_OCCUPANCY: int | None = None
"""Occupancy hint of the decode kernel when the call gives none (None: the compiler's choice,
one ~190 KiB-shared-memory block per SM in the default form)."""


def default_decode_tile_n(head_dim: int) -> int:
    """Keys per decode tile: 16 KiB K/V tiles up to head_dim 128 (64 and 128 measured on H200;
    96 runs as 128), and no fewer than ``DECODE_TILE_N`` keys at 256 (not measured): 32-key
    tiles of 256 compile for sm_90 with ~2 KiB of stack per thread in the default ``cols``
    form, 64-key tiles with 32-344 bytes."""
    return max(DECODE_TILE_N, DECODE_TILE_N * 128 // head_tile(head_dim))


def one_split_tile_n(head_dim: int) -> int:
    """Largest key tile of a one-split launch: ``DECODE_ONE_SPLIT_TILE_KEYS`` up to head_dim 128,
    fewer keys beyond so that a K tile stays at head_dim 128's 64 KiB (256 keys of 256 would
    need 128 KiB each for K and V, more than one SM's shared memory holds)."""
    return min(DECODE_ONE_SPLIT_TILE_KEYS, DECODE_ONE_SPLIT_TILE_KEYS * 128 // head_tile(head_dim))


def plan_splits(
    batch_heads: int,
    kv_tiles: int,
    num_sms: int,
    min_tiles: int = 4,
    waves: int = 2,
    max_splits: int = DECODE_MAX_SPLITS,
) -> int:
    """How many key ranges to split over: ~``waves`` blocks per SM, >= ``min_tiles`` tiles each."""
    if kv_tiles <= 0:
        return 1
    want = max(1, (waves * num_sms) // max(1, batch_heads))
    return max(1, min(want, kv_tiles // max(1, min_tiles), max_splits))


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class DecodePlan:
    """How one decode call runs: ``scheme`` is ``one`` (a single split writes the output),
    ``pdl`` or ``split``; ``splits`` blocks of ``tiles_per_split`` key tiles each
    per (batch, kv head)."""

    scheme: str
    form: str
    tile_n: int
    splits: int
    tiles_per_split: int
    occupancy: int | None = None


def plan_decode(
    batch_heads: int,
    span: int,
    head_dim: int,
    num_sms: int,
    *,
    window: int | None = None,
    mode: str | None = None,
    form: str | None = None,
    tile_n: int | None = None,
    num_splits: int | None = None,
    split_waves: int | None = None,
    min_split_keys: int | None = None,
    occupancy: int | None = None,
) -> DecodePlan:
    """Pure launch plan of ``decode_attention`` for ``batch_heads`` (batch * kv heads) blocks
    over ``span`` keys (the longest key range one sequence may see) and, with a sliding
    ``window``, at most ``window`` of them.

    ``mode`` ``auto`` takes one split with a key tile covering up to
    ``DECODE_ONE_SPLIT_TILE_KEYS`` keys when at most ``DECODE_AUTO_ONE_SPLIT_KEYS`` keys are
    visible (no combine, fewest loop trips), else ``DECODE_AUTO_SCHEME`` with the split plan. The
    other modes use the split plan (``plan_splits``: ~``split_waves`` blocks per SM, >=
    ``min_split_keys`` keys per split; ``num_splits`` overrides it). Explicit arguments win.
    """
    mode = mode or DECODE_MODE
    if mode not in DECODE_MODES:
        raise AttentionInputError(f"decode mode {mode!r} not one of {DECODE_MODES}")
    form = form or DECODE_FORM
    if form not in DECODE_FORMS:
        raise AttentionInputError(f"decode form {form!r} not one of {DECODE_FORMS}")
    span = max(0, int(span))
    visible = span if window is None else min(span, int(window))
    scheme = DECODE_AUTO_SCHEME if mode == "auto" else mode
    one_split = visible <= DECODE_AUTO_ONE_SPLIT_KEYS or batch_heads >= DECODE_AUTO_ONE_SPLIT_BLOCKS
    if mode == "auto" and not num_splits and one_split:
        num_splits = 1
        if tile_n is None:  # one loop trip where it fits, else the fewest (two tile sizes)
            base = default_decode_tile_n(head_dim)
            tile_n = base if visible <= base else max(base, one_split_tile_n(head_dim))
    elif mode == "auto" and not num_splits:
        split_waves = DECODE_AUTO_SPLIT_WAVES if split_waves is None else split_waves
        occupancy = DECODE_AUTO_OCCUPANCY if occupancy is None else occupancy
    tile_n = tile_n or default_decode_tile_n(head_dim)
    if window is not None:  # a window's keys start anywhere in a tile: one more tile at most
        span = min(span, int(window) + tile_n)
    tiles = _cdiv(span, tile_n)
    cap = DECODE_MAX_SPLITS
    if num_splits:
        splits = min(int(num_splits), cap)
    else:
        waves = DECODE_SPLIT_WAVES if split_waves is None else split_waves
        min_keys = DECODE_MIN_SPLIT_KEYS if min_split_keys is None else min_split_keys
        splits = plan_splits(
            batch_heads, tiles, num_sms, min_tiles=max(1, _cdiv(min_keys, tile_n)), waves=waves
        )
        splits = min(splits, cap)
    tiles_per_split = max(1, _cdiv(tiles, splits))
    splits = max(1, _cdiv(tiles, tiles_per_split))
    occupancy = DECODE_OCCUPANCY if occupancy is None else occupancy
    return DecodePlan(
        "one" if splits == 1 else scheme, form, tile_n, splits, tiles_per_split, occupancy
    )


_dummy_lens: dict[torch.device, torch.Tensor] = {}
_dummy_parts: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _placeholders(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Unused split buffers of the right rank for the single-split launch."""
    if buffers_private():  # never read: uninitialized, so a captured graph has no fill for it
        return (
            torch.empty((1, 1, 1, 1, 128), dtype=torch.float32, device=device),
            torch.empty((1, 1, 1, 1), dtype=torch.float32, device=device),
        )
    t = _dummy_parts.get(device)
    if t is None:
        t = (
            torch.zeros((1, 1, 1, 1, 128), dtype=torch.float32, device=device),
            torch.zeros((1, 1, 1, 1), dtype=torch.float32, device=device),
        )
        _dummy_parts[device] = t
    return t


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    kv_end: int | None = None,
    kv_lens: torch.Tensor | None = None,
    position: torch.Tensor | None = None,
    window: int | None = None,
    key_valid: torch.Tensor | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    tile_n: int | None = None,
    split_waves: int | None = None,
    min_split_keys: int | None = None,
    mode: str | None = None,
    form: str | None = None,
    occupancy: int | None = None,
) -> torch.Tensor:
    """Attention of one new token per sequence; returns ``[B, 1, Hq, D]``.

    The token sees keys ``[0, kv_end)`` (default all of ``k``), or ``[0, kv_lens[b])`` per
    sequence, or ``[0, position[0]]`` (``position``: int32 ``[1]`` on the device, the token's
    cache index; no host synchronization, the launch does not depend on its value; a position
    past the last key, a full ring buffer's absolute one, sees every key), intersected
    with the sliding window and ``key_valid``. ``mode`` picks the launch
    scheme (see ``DECODE_MODES``, ``plan_decode``), ``form`` the MMA orientation; ``tile_n``,
    ``split_waves``, ``min_split_keys`` and ``num_splits`` override the split plan and
    ``occupancy`` the decode kernel's occupancy hint.
    """
    if (mode or DECODE_MODE) not in DECODE_MODES:
        raise AttentionInputError(f"decode mode {mode!r} not one of {DECODE_MODES}")
    if (form or DECODE_FORM) not in DECODE_FORMS:
        raise AttentionInputError(f"decode form {form!r} not one of {DECODE_FORMS}")
    b, hq, hkv = _check_common(q, k, v)
    if q.shape[2] != 1:
        raise AttentionInputError(f"decode takes one query token per sequence, got {q.shape[2]}")
    d = q.shape[3]
    skv = k.shape[2]
    kv_end = skv if kv_end is None else int(kv_end)
    if not 0 <= kv_end <= skv:
        raise AttentionInputError(f"kv_end {kv_end} outside [0, {skv}]")
    if window is not None and window <= 0:
        raise AttentionInputError(f"sliding window must be positive, got {window}")
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    k, v = _unit_last_stride(k), _unit_last_stride(v)
    qg = q.reshape(b, hkv, group, d)
    if qg.stride(-1) != 1:
        qg = qg.contiguous()
    kv_arg = _key_valid_arg(key_valid, b, skv)
    lens = LENS_NONE
    span = kv_end
    if kv_lens is not None and position is not None:
        raise AttentionInputError("give kv_lens or position, not both")
    if kv_lens is not None:
        if kv_lens.shape != (b,):
            raise AttentionInputError(f"kv_lens shape {tuple(kv_lens.shape)} != {(b,)}")
        kv_lens = kv_lens.to(torch.int32).contiguous()
        lens, span = LENS_PER_SEQUENCE, skv
    elif position is not None:
        if position.shape != (1,) or position.dtype != torch.int32:
            raise AttentionInputError(
                f"position must be an int32 tensor of shape (1,), got {position.dtype} "
                f"{tuple(position.shape)}"
            )
        kv_lens, lens, span = position, LENS_POSITION, skv
    plan, cfg = _decode_config(
        b * hkv,
        span,
        d,
        group,
        sm_count(q.device),
        window,
        kv_arg is not None,
        lens,
        mode,
        form,
        tile_n,
        num_splits,
        split_waves,
        min_split_keys,
        occupancy,
    )
    return _launch_decode(q, qg, k, v, out, kv_arg, kv_lens, kv_end, window, scale, plan, cfg)


@functools.lru_cache(maxsize=4096)
def _decode_config(bh, span, d, group, sms, window, pad, lens, mode, form, tile_n, nsp, w, mk, occ):
    """``plan_decode`` + ``decode_kernel_config``, cached: a few microseconds of host time per
    call and layer otherwise. (Module constants are read on a key's first call; call
    ``_decode_config.cache_clear()`` after changing them at runtime.)"""
    plan = plan_decode(
        bh,
        span,
        d,
        sms,
        window=window,
        mode=mode,
        form=form,
        tile_n=tile_n,
        num_splits=nsp,
        split_waves=w,
        min_split_keys=mk,
        occupancy=occ,
    )
    return plan, decode_kernel_config(plan, group, window is not None, pad, lens)


def decode_kernel_config(
    plan: DecodePlan, group: int, sliding: bool = False, pad: bool = False, lens: int = LENS_NONE
) -> tuple:
    """Compile-time parameters ``(GP, TILE_N, SLIDING, HAS_PAD, LENS, ROWS, EPI)``
    of the decode kernel for one plan (pure; ``decode_kernel_configs`` lists the AOT ones)."""
    rows = plan.form == "rows"
    gp = DECODE_ROWS_GP if rows else max(8, _next_pow2(group))
    epi = EPI_OUT if plan.scheme == "one" else EPI_PARTS
    return (gp, plan.tile_n, sliding, pad, int(lens), rows, epi)


def _launch_decode(q, qg, k, v, out, kv_arg, kv_lens, kv_end, window, scale, plan, cfg):
    b, hkv, group, d = qg.shape
    hq = hkv * group
    splits = plan.splits
    epi = cfg[6]
    if out is None:
        out = torch.empty((b, 1, hq, d), dtype=q.dtype, device=q.device)
    out_g = out.view(b, hkv, group, d)
    launch_stream = stream()
    if epi == EPI_OUT:
        o_part, lse_part = _placeholders(q.device)
    else:
        n_o = b * hkv * group * splits * d  # one allocation: partial outputs, then their lse
        parts = torch.empty((n_o + b * hkv * group * splits,), dtype=torch.float32, device=q.device)
        o_part = parts[:n_o].view(b, hkv, group, splits, d)
        lse_part = parts[n_o:].view(b, hkv, group, splits)
    lens_arg = kv_lens if kv_lens is not None else _dummy_lens_for(q.device)
    mask_arg = kv_arg if kv_arg is not None else _dummy_mask(q.device)
    ct.launch(
        launch_stream,
        (b * hkv, splits, 1),
        with_occupancy(decode_attention_kernel, plan.occupancy, None),
        (
            qg,
            k,
            v,
            o_part,
            lse_part,
            out_g,
            mask_arg,
            lens_arg,
            _dummy_sinks(q.device, q.dtype),
            scale * LOG2E,
            kv_end,
            int(window or 0),
            plan.tiles_per_split,
            head_tile(d),
            *cfg,
        ),
    )
    if epi == EPI_PARTS:
        pdl = plan.scheme == "pdl"
        ct.launch(
            launch_stream,
            (b * hq, 1, 1),
            decode_reduce_kernel,
            (
                o_part.view(b * hq, splits, d),
                lse_part.view(b * hq, splits),
                out.view(b * hq, d),
                head_tile(d),
                _next_pow2(splits),
                pdl,
            ),
            programmatic_dependent_launch=pdl,
        )
    return out


def _dummy_lens_for(device: torch.device) -> torch.Tensor:
    if buffers_private():
        return torch.empty((1,), dtype=torch.int32, device=device)
    t = _dummy_lens.get(device)
    if t is None:
        t = torch.zeros((1,), dtype=torch.int32, device=device)
        _dummy_lens[device] = t
    return t


# --------------------------------------------------------------------------------------------
# PyTorch references
# --------------------------------------------------------------------------------------------


def reference_mask(
    b: int,
    sq: int,
    skv: int,
    *,
    causal: bool = True,
    q_start: int | None = None,
    window: int | None = None,
    key_valid: torch.Tensor | None = None,
    kv_lens: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Dense boolean mask ``[B, 1, Sq, Skv]`` (True = attend) for the compact description."""
    q_start = skv - sq if q_start is None else q_start
    rows = torch.arange(sq, device=device)[:, None] + q_start
    cols = torch.arange(skv, device=device)[None, :]
    ok = torch.ones((sq, skv), dtype=torch.bool, device=device)
    if causal:
        ok &= cols <= rows
    if window is not None:
        ok &= cols > rows - window
    ok = ok.expand(b, 1, sq, skv).clone()
    if key_valid is not None:
        ok &= key_valid.to(device=device, dtype=torch.bool)[:, None, None, :]
    if kv_lens is not None:
        ok &= cols[None, None] < kv_lens.to(device)[:, None, None, None]
    return ok


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """fp32 SDPA with a dense mask and GQA; rows with no visible key give 0. ``[B, Sq, Hq, D]``."""
    group = q.shape[1] // k.shape[1]
    qf, kf, vf = q.float(), k.float(), v.float()
    kf = kf.repeat_interleave(group, dim=1)
    vf = vf.repeat_interleave(group, dim=1)
    any_key = mask.any(dim=-1, keepdim=True)
    safe = mask | ~any_key
    out = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, attn_mask=safe, scale=scale)
    out = out.masked_fill(~any_key, 0.0)
    return out.transpose(1, 2)


# --------------------------------------------------------------------------------------------
# AOT signatures
# --------------------------------------------------------------------------------------------


def array_constraint(dtype, ndim: int):
    """Constraint for a strided tensor with a unit last stride, as torch hands them to ct.launch."""
    from cuda.tile.compilation import ArrayConstraint

    return ArrayConstraint(
        dtype,
        ndim,
        index_dtype=ct.int32,
        stride_lower_bound_incl=0,
        alias_groups=(),
        may_alias_internally=False,
        stride_constant=[None] * (ndim - 1) + [1],
        base_addr_divisible_by=16,
    )


def _sig(params):
    from cuda.tile.compilation import CallingConvention, KernelSignature

    return KernelSignature(params, CallingConvention.cutile_python_v1())


def prefill_signatures(head_dim: int, num_q_heads: int, group: int, dtype=ct.bfloat16):
    """Signatures the prefill kernel is compiled for at one head configuration."""
    from cuda.tile.compilation import ScalarConstraint

    _check_head_dim(head_dim)
    cfg = default_prefill_config(head_dim)
    sigs = []
    for causal, sliding, pad in ((True, False, False), (True, False, True), (True, True, True)):
        sigs.append(
            _sig(
                [
                    array_constraint(dtype, 4),
                    array_constraint(dtype, 4),
                    array_constraint(dtype, 4),
                    array_constraint(dtype, 4),
                    array_constraint(ct.int8, 2),
                    ScalarConstraint(ct.float32),
                    ScalarConstraint(ct.int32),
                    ScalarConstraint(ct.int32),
                    head_tile(head_dim),
                    num_q_heads,
                    group,
                    cfg.tile_m,
                    cfg.tile_n,
                    causal,
                    sliding,
                    pad,
                ]
            )
        )
    return sigs


def decode_kernel_configs(head_dim: int, group: int) -> list[tuple]:
    """Compile-time parameters ``(GP, TILE_N, SLIDING, HAS_PAD, LENS, ROWS, EPI)`` of the
    decode kernel variants: every form x epilogue at the tiles ``plan_decode`` picks by default
    (the split tile, and the one-split tile of short caches), the padding (+ window) flags of
    the one-split epilogue in the default form, as a model's batched decode has, and the padded
    device-position variants a static cache's decode step runs.
    (Each variant takes ~5-25 s per architecture to compile; the rest JIT-compile on first use.)"""
    g2 = _next_pow2(group)
    base = default_decode_tile_n(head_dim)
    one_tiles = sorted({base, max(base, one_split_tile_n(head_dim))})
    epis = [(EPI_OUT, t) for t in one_tiles] + [(EPI_PARTS, base)]
    out = []
    for rows in (False, True):
        gp = DECODE_ROWS_GP if rows else max(8, g2)
        for epi, tile in epis:
            out.append((gp, tile, False, False, LENS_NONE, rows, epi))
    rows = DECODE_FORM == "rows"
    gp = DECODE_ROWS_GP if rows else max(8, g2)
    for sliding in (False, True):
        for epi, tile in epis:
            out.append((gp, tile, sliding, True, LENS_NONE, rows, epi))
    for epi, tile in epis:
        out.append((gp, tile, False, True, LENS_POSITION, rows, epi))
    return list(dict.fromkeys(out))


def decode_signatures(head_dim: int, group: int, dtype=ct.bfloat16):
    """Signatures of the decode kernels (split + reduction) at one head configuration."""
    from cuda.tile.compilation import ScalarConstraint

    i32 = ScalarConstraint(ct.int32)
    head = [
        array_constraint(dtype, 4),
        array_constraint(dtype, 4),
        array_constraint(dtype, 4),
        array_constraint(ct.float32, 5),
        array_constraint(ct.float32, 4),
        array_constraint(dtype, 4),
    ]
    masks = [array_constraint(ct.int8, 2), array_constraint(ct.int32, 1)]
    masks.append(array_constraint(dtype, 1))  # the sinks (a placeholder here)
    scalars = [ScalarConstraint(ct.float32), i32, i32, i32]
    _check_head_dim(head_dim)
    dec = [
        _sig(head + masks + scalars + [head_tile(head_dim), *cfg])
        for cfg in decode_kernel_configs(head_dim, group)
    ]
    red = [
        _sig(
            [
                array_constraint(ct.float32, 3),
                array_constraint(ct.float32, 2),
                array_constraint(dtype, 2),
                head_tile(head_dim),
                nsp,
                pdl,
            ]
        )
        for nsp in (2, 4, 8, 16, 32, 64)
        for pdl in (False, True)
    ]
    return {decode_attention_kernel: dec, decode_reduce_kernel: red}


def aot_signatures(head_dim: int = 128, num_q_heads: int = 16, num_kv_heads: int = 8):
    """``{kernel: [KernelSignature, ...]}`` for the AOT compile gate (default: qwen3 heads);
    any of ``KERNEL_HEAD_DIMS`` (the kernels' ``D`` is ``head_tile(head_dim)``)."""
    group = num_q_heads // num_kv_heads
    sigs = {prefill_attention_kernel: prefill_signatures(head_dim, num_q_heads, group)}
    sigs.update(decode_signatures(head_dim, group))
    return sigs
