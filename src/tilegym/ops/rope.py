"""Rotary position embedding as transformers applies it, q and k in one launch.

Semantics of ``apply_rotary_pos_emb`` (half-rotation layout): with ``x1, x2`` the two halves of
the rotated part, ``out1 = x1*cos1 - x2*sin1`` and ``out2 = x2*cos2 + x1*sin2``, where cos/sin
come from the model's rotary module (shape ``(B or 1, S, R)``). A partial rotary factor
(``R < head_dim``) rotates the first ``R`` dims and passes the rest through unchanged.

``qk_norm_rope`` fuses Qwen3's per-head q/k RMSNorm with the rotation and the
``(B, S, H, D) -> (B, H, S, D)`` transpose: one launch replaces about twenty PyTorch kernels.
With ``unit_offset`` the norms are Gemma's (``Gemma3RMSNorm``: scaled by ``1 + weight`` in
fp32, see ``tilegym.ops.rms_norm``).
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
    stream,
    with_occupancy,
)


@ct.function
def _rotate_store(x, out, b, s, cb, c, sn, half, rot, TH: ct.Constant[int], TR: ct.Constant[int]):
    """Rotate the first ``rot`` dims of token (b, s) of a (B, H, S, D) array into ``out``."""
    x1 = ct.load(x.slice(3, 0, half), (b, 0, s, 0), (1, TH, 1, TR), padding_mode=PAD_ZERO)
    x2 = ct.load(x.slice(3, half, rot), (b, 0, s, 0), (1, TH, 1, TR), padding_mode=PAD_ZERO)
    c1 = ct.load(c.slice(2, 0, half), (cb, s, 0), (1, 1, TR), padding_mode=PAD_ZERO)
    c2 = ct.load(c.slice(2, half, rot), (cb, s, 0), (1, 1, TR), padding_mode=PAD_ZERO)
    s1 = ct.load(sn.slice(2, 0, half), (cb, s, 0), (1, 1, TR), padding_mode=PAD_ZERO)
    s2 = ct.load(sn.slice(2, half, rot), (cb, s, 0), (1, 1, TR), padding_mode=PAD_ZERO)
    c1 = c1.astype(ct.float32).reshape((1, 1, 1, TR))
    c2 = c2.astype(ct.float32).reshape((1, 1, 1, TR))
    s1 = s1.astype(ct.float32).reshape((1, 1, 1, TR))
    s2 = s2.astype(ct.float32).reshape((1, 1, 1, TR))
    f1 = x1.astype(ct.float32)
    f2 = x2.astype(ct.float32)
    ct.store(out.slice(3, 0, half), (b, 0, s, 0), (f1 * c1 - f2 * s1).astype(out.dtype))
    ct.store(out.slice(3, half, rot), (b, 0, s, 0), (f2 * c2 + f1 * s2).astype(out.dtype))


@ct.function
def _pass_through(x, out, b, s, rot, TH: ct.Constant[int], TP: ct.Constant[int]):
    d = x.shape[3]
    xp = ct.load(x.slice(3, rot, d), (b, 0, s, 0), (1, TH, 1, TP), padding_mode=PAD_ZERO)
    ct.store(out.slice(3, rot, d), (b, 0, s, 0), xp)


@ct.kernel
def rope_kernel(
    q,
    k,
    cos,
    sin,
    q_out,
    k_out,
    cos_batched,
    TQH: ct.Constant[int],
    TKH: ct.Constant[int],
    TR: ct.Constant[int],
    TP: ct.Constant[int],
):
    """One block per token: all q heads and all k heads of that token."""
    t = ct.bid(0)
    seq = q.shape[2]
    b = t // seq
    s = t % seq
    cb = b * cos_batched
    rot = cos.shape[2]
    half = rot // 2
    _rotate_store(q, q_out, b, s, cb, cos, sin, half, rot, TQH, TR)
    _rotate_store(k, k_out, b, s, cb, cos, sin, half, rot, TKH, TR)
    if TP > 0:
        _pass_through(q, q_out, b, s, rot, TQH, TP)
        _pass_through(k, k_out, b, s, rot, TKH, TP)


@ct.function
def _weighted(xn, w, dtype, OFFSET: ct.Constant[bool]):
    """A normalized fp32 tile times its fp32 norm weight: rounded to ``dtype`` first as
    ``Qwen3RMSNorm`` does (``hidden.to(input_dtype)``), or with OFFSET times ``1 + w`` in fp32
    as ``Gemma3RMSNorm`` does."""
    if OFFSET:
        return xn * (w + 1.0)
    return xn.astype(dtype).astype(ct.float32) * w


@ct.function
def _norm_rotate_store(
    x,
    w,
    out,
    b,
    s,
    cb,
    c,
    sn,
    eps,
    TH: ct.Constant[int],
    TR: ct.Constant[int],
    OFFSET: ct.Constant[bool],
):
    """RMSNorm each head of token (b, s) of a (B, S, H, D) array, rotate, store (B, H, S, D)."""
    d = x.shape[3]
    half = d // 2
    x1 = ct.load(x.slice(3, 0, half), (b, s, 0, 0), (1, 1, TH, TR), padding_mode=PAD_ZERO)
    x2 = ct.load(x.slice(3, half, d), (b, s, 0, 0), (1, 1, TH, TR), padding_mode=PAD_ZERO)
    f1 = x1.astype(ct.float32)
    f2 = x2.astype(ct.float32)
    ss = ct.sum(f1 * f1, axis=3, keepdims=True) + ct.sum(f2 * f2, axis=3, keepdims=True)
    inv = ct.rsqrt(ss / d + eps)
    w1 = ct.load(w.slice(0, 0, half), (0,), (TR,), padding_mode=PAD_ZERO).astype(ct.float32)
    w2 = ct.load(w.slice(0, half, d), (0,), (TR,), padding_mode=PAD_ZERO).astype(ct.float32)
    n1 = _weighted(f1 * inv, w1.reshape((1, 1, 1, TR)), x.dtype, OFFSET)
    n2 = _weighted(f2 * inv, w2.reshape((1, 1, 1, TR)), x.dtype, OFFSET)
    n1 = n1.astype(out.dtype).astype(ct.float32).reshape((1, TH, 1, TR))
    n2 = n2.astype(out.dtype).astype(ct.float32).reshape((1, TH, 1, TR))
    c1 = ct.load(c.slice(2, 0, half), (cb, s, 0), (1, 1, TR), padding_mode=PAD_ZERO)
    c2 = ct.load(c.slice(2, half, d), (cb, s, 0), (1, 1, TR), padding_mode=PAD_ZERO)
    s1 = ct.load(sn.slice(2, 0, half), (cb, s, 0), (1, 1, TR), padding_mode=PAD_ZERO)
    s2 = ct.load(sn.slice(2, half, d), (cb, s, 0), (1, 1, TR), padding_mode=PAD_ZERO)
    c1 = c1.astype(ct.float32).reshape((1, 1, 1, TR))
    c2 = c2.astype(ct.float32).reshape((1, 1, 1, TR))
    s1 = s1.astype(ct.float32).reshape((1, 1, 1, TR))
    s2 = s2.astype(ct.float32).reshape((1, 1, 1, TR))
    ct.store(out.slice(3, 0, half), (b, 0, s, 0), (n1 * c1 - n2 * s1).astype(out.dtype))
    ct.store(out.slice(3, half, d), (b, 0, s, 0), (n2 * c2 + n1 * s2).astype(out.dtype))


@ct.kernel
def qk_norm_rope_kernel(
    q,
    k,
    q_weight,
    k_weight,
    cos,
    sin,
    q_out,
    k_out,
    eps,
    cos_batched,
    TQH: ct.Constant[int],
    TKH: ct.Constant[int],
    TR: ct.Constant[int],
    OFFSET: ct.Constant[bool],
):
    """One block per token: per-head RMSNorm of q and k, then RoPE, written head-major."""
    t = ct.bid(0)
    seq = q.shape[1]
    b = t // seq
    s = t % seq
    cb = b * cos_batched
    _norm_rotate_store(q, q_weight, q_out, b, s, cb, cos, sin, eps, TQH, TR, OFFSET)
    _norm_rotate_store(k, k_weight, k_out, b, s, cb, cos, sin, eps, TKH, TR, OFFSET)


#: Kernel choice of ``apply_rope`` / ``qk_norm_rope`` without a ``variant`` argument:
#: "auto" = "token" for at most ``*_TOKEN_MAX`` tokens (decode: fewest host-side view ops and
#: launch arguments) and "loop" above, or always "loop" for halves that are not power-of-two
#: tiles (``_pick``); or "token" / "loop" for every size.
#:
#: - "token": the first version, one block per token, each half a ``slice`` at a run-time
#:   offset: sm_90 SASS has only scalar 2-byte loads and stores (LDG.E.U16 / STG.E.U16);
#:   ~25% of copy bandwidth at 2048 tokens, but the fewest host-side ops per call.
#: - "loop": grid (head groups, token tiles, batch); each block loads its token tile's cos/sin
#:   once and rotates its heads one at a time in a run-time loop (see ``rope_loop_kernel``):
#:   16-byte loads and stores, no shared memory, three heads' loads in flight (sm_90 SASS).
#:   qwen3 4x4096 on the H200: RoPE 64 us (78% of a copy of its bytes), q/k-norm+RoPE 79 us
#:   (65%): docs/results/h200-2026-11-30/ops/rope_loop.txt, qk_norm_loop.txt.
#:
#: Two earlier large-token kernels lost to "loop" at every measured size and were removed
#: (code at commit d5c270c): "tiled" (all heads of a few tokens per block; 46-52% of copy)
#: and "heads" (8 heads x a token tile per block, cos/sin broadcast over the heads through
#: shared memory; 50-52%): docs/results/h200-2026-11-29/ops/rope_experiments.txt.
ROPE_VARIANT = "auto"
QK_VARIANT = "auto"
#: "auto" uses the per-token kernel up to this many tokens (batch x seq), "loop" above.
ROPE_TOKEN_MAX = 32
QK_TOKEN_MAX = 32
#: "loop": heads per block (looped one at a time), tokens per block, the loads' latency hint
#: (tileiras software-pipelines the head loop deeper for smaller hints: more loads in flight,
#: more registers) and occupancy hint (resident blocks per SM; caps registers per thread).
ROPE_LOOP_HEADS = 8
ROPE_LOOP_TOKENS = 16
ROPE_LOOP_LATENCY = 1
ROPE_LOOP_OCCUPANCY = 4
QK_LOOP_HEADS = 8
QK_LOOP_TOKENS = 16
QK_LOOP_LATENCY = 1
QK_LOOP_OCCUPANCY = 3


#: Variants the benchmark sweeps and the GPU tests check: name -> keyword arguments of
#: ``apply_rope`` (``ROPE_VARIANTS``) / ``qk_norm_rope`` (``QK_VARIANTS``). "auto" is the
#: default dispatch ("auto-hN": with ``decode_heads`` N, what a model's ``rope_heads`` tuning
#: launches), "token" the per-token kernel, "l*" the head-loop kernel (l = heads per
#: block, t = tokens per block, L = latency hint, o = occupancy; sm_90 SASS: 70-154
#: registers, no spills, no shared memory).
ROPE_VARIANTS = {
    "auto": dict(),
    "token": dict(variant="token"),
    "auto-h1": dict(decode_heads=1),
    "auto-h2": dict(decode_heads=2),
    "l8-t16-L1-o4": dict(variant="loop", heads=8, tokens=16, latency=1, occupancy=4),
    "l2-t16-L1-o4": dict(variant="loop", heads=2, tokens=16, latency=1, occupancy=4),
    "l4-t16-L1-o4": dict(variant="loop", heads=4, tokens=16, latency=1, occupancy=4),
    "l8-t16-L1-o5": dict(variant="loop", heads=8, tokens=16, latency=1, occupancy=5),
    "l8-t16-L4-o3": dict(variant="loop", heads=8, tokens=16, latency=4, occupancy=3),
    "l8-t16-L10-o6": dict(variant="loop", heads=8, tokens=16, latency=10, occupancy=6),
    "l8-t8-L1-o6": dict(variant="loop", heads=8, tokens=8, latency=1, occupancy=6),
    "l32-t16-L1-o4": dict(variant="loop", heads=32, tokens=16, latency=1, occupancy=4),
}
QK_VARIANTS = {
    "auto": dict(),
    "token": dict(variant="token"),
    "auto-h1": dict(decode_heads=1),
    "auto-h2": dict(decode_heads=2),
    "l8-t16-L1-o3": dict(variant="loop", heads=8, tokens=16, latency=1, occupancy=3),
    "l8-t16-L2-o3": dict(variant="loop", heads=8, tokens=16, latency=2, occupancy=3),
    "l8-t16-L2-o4": dict(variant="loop", heads=8, tokens=16, latency=2, occupancy=4),
    "l8-t16-L4-o3": dict(variant="loop", heads=8, tokens=16, latency=4, occupancy=3),
    "l8-t8-L1-o5": dict(variant="loop", heads=8, tokens=8, latency=1, occupancy=5),
}


# The "loop" kernels' arrays come in one of two layouts, fixed per compiled kernel by the
# arrays' rank: 4D / 3D / 1D arrays exactly as the caller has them (q/k (.., D), cos/sin
# (B or 1, S, R), weights (D,)) when R/2 is a power of two and the rotary part is the whole head
# (every real model): half ``i`` is then tile ``i`` of extent TR = R/2 on the last axis, so the
# host makes no views of the inputs; or (..., 2, R/2) views (one more axis, the halves on their
# own axis) for any other R and for partial rotary.


@ct.function
def _cs_half(t, cb, sb, i, TS: ct.Constant[int], TR: ct.Constant[int]):
    """Half ``i`` of TS tokens' cos or sin ((B or 1, S, R) or (B or 1, S, 2, R/2)), fp32
    (1, TS, TR)."""
    if t.ndim == 4:
        h = ct.load(t, (cb, sb, i, 0), (1, TS, 1, TR), padding_mode=PAD_ZERO, allow_tma=False)
    else:
        h = ct.load(t, (cb, sb, i), (1, TS, TR), padding_mode=PAD_ZERO, allow_tma=False)
    return h.astype(ct.float32).reshape((1, TS, TR))


@ct.function
def _w_half(w, i, TR: ct.Constant[int]):
    """Half ``i`` of a norm weight ((D,) or (2, D/2)) as fp32 (TR,)."""
    if w.ndim == 2:
        h = ct.load(w, (i, 0), (1, TR), padding_mode=PAD_ZERO, allow_tma=False).reshape((TR,))
    else:
        h = ct.load(w, (i,), (TR,), padding_mode=PAD_ZERO, allow_tma=False)
    return h.astype(ct.float32)


# "loop" kernels: each block loads a token tile's cos/sin once and then rotates its TH heads one
# at a time in a run-time loop, so every q/k tile has cos/sin's own (TS, R/2) shape: no
# broadcast over heads, hence no shared-memory relayout (the removed "heads" kernels' cost:
# 8 barriers per block in sm_90 SASS). Each half goes to its own output array (``lo``/``hi``:
# views of the output's halves) so every array is stored once per iteration at the loop index:
# cuTile then leaves the iterations' stores unordered (its "parallel store" rule); one array
# stored twice per iteration costs a block-wide barrier per head.


@ct.function
def _ld_head(x, idx, i, TA: ct.Constant[int], TB: ct.Constant[int], TR: ct.Constant[int], LAT):
    """Half ``i`` of the (TA, TB) block at ``idx`` of a 4D array (halves = last-axis tiles 0,
    1) or of its 5D (..., 2, R/2) view, as an fp32 (1, TA, TB, TR) tile."""
    if x.ndim == 5:
        t = ct.load(
            x,
            (idx[0], idx[1], idx[2], i, 0),
            (1, TA, TB, 1, TR),
            padding_mode=PAD_ZERO,
            latency=LAT,
            allow_tma=False,
        ).reshape((1, TA, TB, TR))
    else:
        t = ct.load(
            x,
            (idx[0], idx[1], idx[2], i),
            (1, TA, TB, TR),
            padding_mode=PAD_ZERO,
            latency=LAT,
            allow_tma=False,
        )
    return t.astype(ct.float32)


@ct.function
def _rope_loop(
    x,
    lo,
    hi,
    x_pass,
    out_pass,
    b,
    h0,
    h1,
    sb,
    cs,
    TS: ct.Constant[int],
    TR: ct.Constant[int],
    TP: ct.Constant[int],
    LAT: ct.Constant[int],
):
    """Rotate heads ``h0 .. h1 - 1`` of token tile ``sb`` (and copy their pass-through part)."""
    c1, c2, s1, s2 = cs
    for h in range(h0, h1):
        x1 = _ld_head(x, (b, h, sb), 0, 1, TS, TR, LAT)
        x2 = _ld_head(x, (b, h, sb), 1, 1, TS, TR, LAT)
        ct.store(lo, (b, h, sb, 0), (x1 * c1 - x2 * s1).astype(lo.dtype), allow_tma=False)
        ct.store(hi, (b, h, sb, 0), (x2 * c2 + x1 * s2).astype(hi.dtype), allow_tma=False)
        if TP > 0:
            xp = ct.load(x_pass, (b, h, sb, 0), (1, 1, TS, TP), padding_mode=PAD_ZERO, latency=LAT)
            ct.store(out_pass, (b, h, sb, 0), xp, allow_tma=False)


@ct.function
def _cs_tiles(cos, sin, cb, sb, shape, TS: ct.Constant[int], TR: ct.Constant[int]):
    """(c1, c2, s1, s2) of token tile ``sb``, fp32, reshaped to ``shape``."""
    return (
        _cs_half(cos, cb, sb, 0, TS, TR).reshape(shape),
        _cs_half(cos, cb, sb, 1, TS, TR).reshape(shape),
        _cs_half(sin, cb, sb, 0, TS, TR).reshape(shape),
        _cs_half(sin, cb, sb, 1, TS, TR).reshape(shape),
    )


@ct.kernel(occupancy=ROPE_LOOP_OCCUPANCY)
def rope_loop_kernel(
    q,
    k,
    q_pass,
    k_pass,
    cos,
    sin,
    q_lo,
    q_hi,
    k_lo,
    k_hi,
    q_pass_out,
    k_pass_out,
    cos_batched,
    TH: ct.Constant[int],
    TS: ct.Constant[int],
    TR: ct.Constant[int],
    TP: ct.Constant[int],
    LAT: ct.Constant[int],
):
    """Grid (q head groups + k head groups, token tiles, batch): up to TH heads x TS tokens.

    q/k (B, H, S, D) with cos/sin (B or 1, S, D), or (B, H, S, 2, R/2) views with cos/sin
    (B or 1, S, 2, R/2); ``*_lo``/``*_hi`` the (B, H, S, R/2) halves of the outputs; the
    pass-through parts (B, H, S, D - R) are copied when TP > 0 (else placeholders).
    """
    g = ct.bid(0)
    sb = ct.bid(1)
    b = ct.bid(2)
    hq = q.shape[1]
    nq = ct.cdiv(hq, TH)
    cs = _cs_tiles(cos, sin, b * cos_batched, sb, (1, 1, TS, TR), TS, TR)
    if g < nq:
        h0 = g * TH
        _rope_loop(
            q, q_lo, q_hi, q_pass, q_pass_out, b, h0, min(h0 + TH, hq), sb, cs, TS, TR, TP, LAT
        )
    else:
        h0 = (g - nq) * TH
        hk = k.shape[1]
        _rope_loop(
            k, k_lo, k_hi, k_pass, k_pass_out, b, h0, min(h0 + TH, hk), sb, cs, TS, TR, TP, LAT
        )


@ct.function
def _norm_rope_loop(
    x,
    w,
    lo,
    hi,
    b,
    h0,
    h1,
    sb,
    cs,
    eps,
    TS: ct.Constant[int],
    TR: ct.Constant[int],
    LAT: ct.Constant[int],
    OFFSET: ct.Constant[bool],
):
    """RMSNorm + rotate heads ``h0 .. h1 - 1`` of token tile ``sb`` of a (B, S, H, D) array;
    store them head-major into the (B, H, S, R/2) halves ``lo``/``hi``.

    Numerics: the normed row is rounded to the input dtype as ``Qwen3RMSNorm`` does
    (``hidden.to(input_dtype)``), then weighted and rotated in fp32 and rounded once; the
    other q/k-norm kernels (and transformers) also round the weighted row before rotating.
    Skipping that rounding is closer to fp32 (rel err 2.4e-3 vs 2.9e-3 at qwen3 4x4096) and
    made this kernel 1.6x faster on the H200 (79 vs 125 us: fewer conversions on the
    loop's dependency chain; docs/results/h200-2026-11-30/ops/qk_norm_loop.txt)."""
    c1, c2, s1, s2 = cs
    d = 2 * x.shape[4] if x.ndim == 5 else 2 * TR
    w1 = _w_half(w, 0, TR).reshape((1, 1, 1, TR))
    w2 = _w_half(w, 1, TR).reshape((1, 1, 1, TR))
    for h in range(h0, h1):
        x1 = _ld_head(x, (b, sb, h), 0, TS, 1, TR, LAT)
        x2 = _ld_head(x, (b, sb, h), 1, TS, 1, TR, LAT)
        sq = ct.sum(x1 * x1, axis=3, keepdims=True) + ct.sum(x2 * x2, axis=3, keepdims=True)
        inv = ct.rsqrt(sq / d + eps)
        n1 = _weighted(x1 * inv, w1, x.dtype, OFFSET)
        n2 = _weighted(x2 * inv, w2, x.dtype, OFFSET)
        o1 = (n1 * c1 - n2 * s1).astype(lo.dtype).reshape((1, 1, TS, TR))
        o2 = (n2 * c2 + n1 * s2).astype(hi.dtype).reshape((1, 1, TS, TR))
        ct.store(lo, (b, h, sb, 0), o1, allow_tma=False)
        ct.store(hi, (b, h, sb, 0), o2, allow_tma=False)


@ct.kernel(occupancy=QK_LOOP_OCCUPANCY)
def qk_norm_rope_loop_kernel(
    q,
    k,
    q_weight,
    k_weight,
    cos,
    sin,
    q_lo,
    q_hi,
    k_lo,
    k_hi,
    eps,
    cos_batched,
    TH: ct.Constant[int],
    TS: ct.Constant[int],
    TR: ct.Constant[int],
    LAT: ct.Constant[int],
    OFFSET: ct.Constant[bool],
):
    """Grid (q head groups + k head groups, token tiles, batch): per-head RMSNorm + RoPE of up
    to TH heads x TS tokens per block, a head at a time. q/k (B, S, H, D), weights (D,), cos/sin
    (B or 1, S, D), or the (..., 2, D/2) views of all of them; ``*_lo``/``*_hi`` the (B, H, S,
    D/2) halves of the head-major outputs."""
    g = ct.bid(0)
    sb = ct.bid(1)
    b = ct.bid(2)
    hq = q.shape[2]
    nq = ct.cdiv(hq, TH)
    cs = _cs_tiles(cos, sin, b * cos_batched, sb, (1, TS, 1, TR), TS, TR)
    if g < nq:
        h1 = min(g * TH + TH, hq)
        _norm_rope_loop(q, q_weight, q_lo, q_hi, b, g * TH, h1, sb, cs, eps, TS, TR, LAT, OFFSET)
    else:
        h0 = (g - nq) * TH
        h1 = min(h0 + TH, k.shape[2])
        _norm_rope_loop(k, k_weight, k_lo, k_hi, b, h0, h1, sb, cs, eps, TS, TR, LAT, OFFSET)


def _last_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _cos_sin(cos: torch.Tensor, sin: torch.Tensor, batch: int, seq: int):
    if cos.dim() == 2:
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    if cos.shape != sin.shape or cos.dim() != 3 or cos.shape[1] != seq:
        raise ValueError(f"cos/sin must be (B or 1, {seq}, R), got {tuple(cos.shape)}")
    if cos.shape[0] not in (1, batch):
        raise ValueError(f"cos/sin batch {cos.shape[0]} must be 1 or {batch}")
    rot = cos.shape[-1]
    if rot % 2:
        raise ValueError(f"rotary dim {rot} must be even")
    return _last_contiguous(cos), _last_contiguous(sin), int(cos.shape[0] > 1)


def _halves(t: torch.Tensor, rot: int) -> torch.Tensor:
    """(..., D) -> (..., 2, rot/2) view of the rotated part (the two halves on their own axis),
    as one ``as_strided`` (a single cheap host-side op; no copy, no kernel)."""
    st = t.stride()
    half = rot // 2
    return t.as_strided((*t.shape[:-1], 2, half), (*st[:-1], half * st[-1], st[-1]))


def _halves_out(out: torch.Tensor, rot: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (..., R/2) views of the two rotated halves of ``out`` (the "loop" kernels' outputs)."""
    half = rot // 2
    return out[..., :half], out[..., half:rot]


def _tokens(tokens: int, seq: int) -> int:
    """Tokens per block: at most ``tokens``, no more than the sequence needs (decode: 1)."""
    return min(tokens, next_pow2(seq))


def _flat(rot: int, d: int) -> bool:
    """Whether the "loop" kernels take the inputs as they are (full rotary, R/2 a power of
    two: the halves are whole tiles of the last axis) instead of (..., 2, R/2) views."""
    return rot == d and next_pow2(rot // 2) == rot // 2


def _loop_grid(th: int, ts: int, hq: int, hk: int, seq: int, bsz: int) -> tuple[int, int, int]:
    """(q head groups + k head groups, token tiles, batch) of the "loop" kernels."""
    return ((hq + th - 1) // th + (hk + th - 1) // th, (seq + ts - 1) // ts, bsz)


VARIANT_NAMES = ("token", "loop")


def _pick(
    variant: str | None,
    default: str,
    token_max: int,
    ntok: int,
    flat: bool,
    decode_heads: int = 0,
) -> tuple[str, int | None]:
    """(the variant to launch, heads per "loop" block where the dispatch sets them, else None).

    "auto" is "token" up to ``token_max`` tokens, "loop" above, and "loop" at every size when
    the rotary halves are not whole power-of-two tiles (``flat``): there the per-token kernel
    pads each half and took 27 us a decode step for Phi-3.5-mini's 32 heads of 96 (1 token; the
    loop kernel 8 us; H200, bench_rope.py --models phi3). With ``decode_heads`` "auto" launches
    the "loop" kernel with that many heads a block up to ``token_max`` tokens too: the per-token
    kernel is one block a token, so at batch 1 one block normalizes and rotates every head
    (qwen3's q/k norm + RoPE: 6.1 us a decode step on the H200, beside 1.3 us for the KV-cache
    write), where one head a block spreads them over as many blocks."""
    if decode_heads < 0:
        raise ValueError(f"decode_heads must be >= 0, got {decode_heads}")
    v = variant or default
    if v == "auto":
        if ntok <= token_max and decode_heads:
            return "loop", decode_heads
        return ("token" if flat and ntok <= token_max else "loop"), None
    if v not in VARIANT_NAMES:
        raise ValueError(f"unknown variant {v!r} (auto, {', '.join(VARIANT_NAMES)})")
    return v, None


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    variant: str | None = None,
    tokens: int | None = None,
    occupancy=DEFAULT,
    heads: int | None = None,
    latency: int | None = None,
    decode_heads: int = 0,
):
    """``apply_rotary_pos_emb(q, k, cos, sin)`` for (B, H, S, D) q/k (any strides).

    ``cos``/``sin`` are ``(B or 1, S, R)`` with ``R <= D`` (partial rotary: the rest of each
    head passes through). Returns new contiguous (B, H, S, D) tensors. ``variant`` ("auto",
    "token", "loop") and, for "loop", ``heads`` / ``tokens`` per block, ``latency`` and
    ``occupancy`` hints pick a kernel variant (defaults: the ``ROPE_*`` constants);
    ``decode_heads``: "auto" runs up to ``ROPE_TOKEN_MAX`` tokens on the "loop" kernel with that
    many heads a block (0: the per-token kernel, see ``_pick``).
    """
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        check_activation(name, t)
    if q.dim() != 4 or k.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(f"q {tuple(q.shape)} / k {tuple(k.shape)} must be (B, H, S, D) alike")
    bsz, hq, seq, d = q.shape
    hk = k.shape[1]
    cos, sin, batched = _cos_sin(cos, sin, bsz, seq)
    rot = cos.shape[-1]
    if rot > d:
        raise ValueError(f"rotary dim {rot} exceeds head dim {d}")
    q, k = _last_contiguous(q), _last_contiguous(k)
    q_out = torch.empty((bsz, hq, seq, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((bsz, hk, seq, d), dtype=k.dtype, device=k.device)
    if not bsz * seq:
        return q_out, k_out
    kind, small = _pick(
        variant, ROPE_VARIANT, ROPE_TOKEN_MAX, bsz * seq, _flat(rot, d), decode_heads
    )
    if kind == "token":
        consts = rope_constants(hq, hk, d, rot)
        args = (q, k, cos, sin, q_out, k_out, batched, *consts)
        ct.launch(stream(), (bsz * seq, 1, 1), rope_kernel, args)
        return q_out, k_out
    tp = next_pow2(d - rot) if rot < d else 0
    if _flat(rot, d):  # halves are tiles 0 and 1 of the last axis; q/k also stand in for
        ins = (q, k, q, k, cos, sin)  # the pass-through parts (TP == 0: never read)
    else:
        rest = (q[..., rot:], k[..., rot:]) if tp else (q, k)
        ins = (_halves(q, rot), _halves(k, rot), *rest, _halves(cos, rot), _halves(sin, rot))
    outs = (*_halves_out(q_out, rot), *_halves_out(k_out, rot))
    outs += (q_out[..., rot:], k_out[..., rot:]) if tp else (q_out, k_out)
    th = min(heads or small or ROPE_LOOP_HEADS, max(hq, hk))
    ts = _tokens(tokens or ROPE_LOOP_TOKENS, seq)
    occ = ROPE_LOOP_OCCUPANCY if occupancy is DEFAULT else occupancy
    kernel = with_occupancy(rope_loop_kernel, occ, ROPE_LOOP_OCCUPANCY)
    consts = (th, ts, next_pow2(rot // 2), tp, latency or ROPE_LOOP_LATENCY)
    ct.launch(
        stream(), _loop_grid(th, ts, hq, hk, seq, bsz), kernel, (*ins, *outs, batched, *consts)
    )
    return q_out, k_out


def rope_constants(hq: int, hk: int, d: int, rot: int) -> tuple[int, int, int, int]:
    """(TQH, TKH, TR, TP) tile extents for ``rope_kernel``; TP = 0 when nothing passes through."""
    return next_pow2(hq), next_pow2(hk), next_pow2(rot // 2), next_pow2(d - rot) if rot < d else 0


def qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    unit_offset: bool = False,
    variant: str | None = None,
    tokens: int | None = None,
    occupancy=DEFAULT,
    heads: int | None = None,
    latency: int | None = None,
    decode_heads: int = 0,
):
    """Qwen3's ``q_norm``/``k_norm`` (per head) + transpose + RoPE, q and k in one launch
    (``unit_offset``: Gemma's ``(1 + weight)`` norms, outputs in q's dtype).

    ``q``/``k`` are the projections viewed ``(B, S, H, D)`` (any strides, e.g. slices of a
    fused QKV output); returns contiguous ``(B, H, S, D)`` q and k. Full rotary only.
    Variant keywords and ``decode_heads``: as for :func:`apply_rope` (``QK_*`` defaults).
    """
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        check_activation(name, t)
    if q.dim() != 4 or k.dim() != 4 or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} / k {tuple(k.shape)} must be (B, S, H, D) alike")
    bsz, seq, hq, d = q.shape
    hk = k.shape[2]
    cos, sin, batched = _cos_sin(cos, sin, bsz, seq)
    if cos.shape[-1] != d or d % 2:
        raise ValueError(f"qk_norm_rope needs full rotary: cos dim {cos.shape[-1]} vs head {d}")
    if q_weight.shape != (d,) or k_weight.shape != (d,):
        raise ValueError("q/k norm weights must have shape (head_dim,)")
    q, k = _last_contiguous(q), _last_contiguous(k)
    out_dtype = q.dtype if unit_offset else torch.promote_types(q.dtype, q_weight.dtype)
    q_out = torch.empty((bsz, hq, seq, d), dtype=out_dtype, device=q.device)
    k_out = torch.empty((bsz, hk, seq, d), dtype=out_dtype, device=q.device)
    if not bsz * seq:
        return q_out, k_out
    qw, kw = _last_contiguous(q_weight), _last_contiguous(k_weight)
    kind, small = _pick(variant, QK_VARIANT, QK_TOKEN_MAX, bsz * seq, _flat(d, d), decode_heads)
    if kind == "token":
        tq, tk, tr = next_pow2(hq), next_pow2(hk), next_pow2(d // 2)
        args = (q, k, qw, kw, cos, sin, q_out, k_out, float(eps), batched, tq, tk, tr)
        ct.launch(stream(), (bsz * seq, 1, 1), qk_norm_rope_kernel, (*args, bool(unit_offset)))
        return q_out, k_out
    ins = (q, k, qw, kw, cos, sin)
    if not _flat(d, d):
        ins = tuple(_halves(t, d) for t in ins)
    th = min(heads or small or QK_LOOP_HEADS, max(hq, hk))
    ts = _tokens(tokens or QK_LOOP_TOKENS, seq)
    occ = QK_LOOP_OCCUPANCY if occupancy is DEFAULT else occupancy
    kernel = with_occupancy(qk_norm_rope_loop_kernel, occ, QK_LOOP_OCCUPANCY)
    outs = (*_halves_out(q_out, d), *_halves_out(k_out, d))
    consts = (th, ts, next_pow2(d // 2), latency or QK_LOOP_LATENCY, bool(unit_offset))
    args = (*ins, *outs, float(eps), batched, *consts)
    ct.launch(stream(), _loop_grid(th, ts, hq, hk, seq, bsz), kernel, args)
    return q_out, k_out


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """transformers' ``rotate_half``."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope_reference(q, k, cos, sin, unsqueeze_dim: int = 1):
    """transformers' ``apply_rotary_pos_emb``, extended to partial rotary as e.g. GLM does."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    rot = cos.shape[-1]

    def one(x):
        xr, xp = x[..., :rot], x[..., rot:]
        return torch.cat(((xr * cos) + (rotate_half(xr) * sin), xp), dim=-1)

    return one(q), one(k)


def qk_norm_rope_reference(q, k, q_weight, k_weight, eps, cos, sin, unit_offset: bool = False):
    """Qwen3Attention: ``q_norm(q).transpose(1, 2)`` etc., then ``apply_rotary_pos_emb``
    (``unit_offset``: Gemma3Attention's norms)."""
    from tilegym.ops.rms_norm import rms_norm_reference

    qn = rms_norm_reference(q, q_weight, eps, unit_offset).transpose(1, 2)
    kn = rms_norm_reference(k, k_weight, eps, unit_offset).transpose(1, 2)
    return apply_rope_reference(qn, kn, cos, sin)


def _rope_kernels(variant: str) -> list:
    kernels = {"token": [rope_kernel], "loop": [rope_loop_kernel]}
    return kernels["token"] + kernels["loop"] if variant == "auto" else kernels[variant]


def _qk_kernels(variant: str) -> list:
    kernels = {"token": [qk_norm_rope_kernel], "loop": [qk_norm_rope_loop_kernel]}
    return kernels["token"] + kernels["loop"] if variant == "auto" else kernels[variant]


def default_rope_kernels() -> list:
    """The RoPE kernels ``apply_rope`` launches by default (``ROPE_VARIANT``; "auto": two)."""
    return _rope_kernels(ROPE_VARIANT)


def default_qk_kernels() -> list:
    """The q/k-norm + RoPE kernels ``qk_norm_rope`` launches by default (``QK_VARIANT``)."""
    return _qk_kernels(QK_VARIANT)


def _token_counts(tokens: int) -> list[int]:
    """Every tokens-per-block value ``_tokens`` can pick: powers of two up to ``tokens``."""
    return [1 << i for i in range(tokens.bit_length()) if 1 << i <= tokens]


def _rope_sigs(kernel, dt, hq, hk, d, rot, decode_heads=()) -> list:
    a5, a4, a3 = (array_sig(dt, n) for n in (5, 4, 3))
    i32 = ScalarConstraint(ct.int32)
    tq, tk, tr, tp = rope_constants(hq, hk, d, rot)
    if kernel is rope_kernel:
        return [signature(a4, a4, a3, a3, a4, a4, i32, tq, tk, tr, tp)]
    ins = (a4, a4, a4, a4, a3, a3) if _flat(rot, d) else (a5, a5, a4, a4, a4, a4)
    th = min(ROPE_LOOP_HEADS, max(hq, hk))
    plans = [(th, ts) for ts in _token_counts(ROPE_LOOP_TOKENS)]
    plans += [p for p in ((min(h, max(hq, hk)), 1) for h in decode_heads) if p not in plans]
    return [signature(*ins, *(a4,) * 6, i32, h, ts, tr, tp, ROPE_LOOP_LATENCY) for h, ts in plans]


def _qk_sigs(kernel, dt, hq, hk, d, offset: bool = False, decode_heads=()) -> list:
    a5, a4, a3, a2, a1 = (array_sig(dt, n) for n in (5, 4, 3, 2, 1))
    i32, f32 = ScalarConstraint(ct.int32), ScalarConstraint(ct.float32)
    tr = next_pow2(d // 2)
    if kernel is qk_norm_rope_kernel:
        heads = (next_pow2(hq), next_pow2(hk))
        return [signature(a4, a4, a1, a1, a3, a3, a4, a4, f32, i32, *heads, tr, offset)]
    ins = (a4, a4, a1, a1, a3, a3) if _flat(d, d) else (a5, a5, a2, a2, a4, a4)
    th = min(QK_LOOP_HEADS, max(hq, hk))
    plans = [(th, ts) for ts in _token_counts(QK_LOOP_TOKENS)]
    plans += [p for p in ((min(h, max(hq, hk)), 1) for h in decode_heads) if p not in plans]
    return [
        signature(*ins, a4, a4, a4, a4, f32, i32, h, ts, tr, QK_LOOP_LATENCY, offset)
        for h, ts in plans
    ]


def aot_signatures(
    heads=((16, 8, 128), (32, 8, 64)),
    dtypes=AOT_DTYPES,
    partial_rot=((32, 8, 64, 32),),
    ops=("rope", "qk"),
    unit_offsets=(False,),
    decode_heads=(),
) -> dict:
    """AOT signatures of the kernels the defaults launch ("auto": the per-token kernel and the
    "loop" one): (q heads, kv heads, head dim) of Qwen3-0.6B and Llama-3.2-1B, plus a
    partial-rotary layout for RoPE; every tokens-per-block value. ``ops`` picks RoPE ("rope")
    and / or q/k-norm + RoPE ("qk"), ``unit_offsets`` the q/k norms' forms, ``decode_heads``
    the head-loop kernels' decode launches a model's ``rope_heads`` tuning adds (one token a
    block, that many heads)."""
    out: dict = {}
    layouts = [(hq, hk, d, d) for hq, hk, d in heads] + list(partial_rot)
    for dt in dtypes:
        if "rope" in ops:
            for kernel in default_rope_kernels():
                for hq, hk, d, rot in layouts:
                    sigs = _rope_sigs(kernel, dt, hq, hk, d, rot, decode_heads)
                    out.setdefault(kernel, []).extend(sigs)
        if "qk" in ops:
            for kernel in default_qk_kernels():
                for (hq, hk, d), offset in ((h, o) for h in heads for o in unit_offsets):
                    sigs = _qk_sigs(kernel, dt, hq, hk, d, offset, decode_heads)
                    out.setdefault(kernel, []).extend(sigs)
    return out
