"""Rotary position embedding as transformers applies it, q and k in one launch.

Semantics of ``apply_rotary_pos_emb`` (half-rotation layout): with ``x1, x2`` the two halves of
the rotated part, ``out1 = x1*cos1 - x2*sin1`` and ``out2 = x2*cos2 + x1*sin2``, where cos/sin
come from the model's rotary module (shape ``(B or 1, S, R)``). A partial rotary factor
(``R < head_dim``) rotates the first ``R`` dims and passes the rest through unchanged.

``qk_norm_rope`` fuses Qwen3's per-head q/k RMSNorm with the rotation and the
``(B, S, H, D) -> (B, H, S, D)`` transpose: one launch replaces about twenty PyTorch kernels.
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
def _norm_rotate_store(x, w, out, b, s, cb, c, sn, eps, TH: ct.Constant[int], TR: ct.Constant[int]):
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
    n1 = (f1 * inv).astype(x.dtype).astype(ct.float32) * w1.reshape((1, 1, 1, TR))
    n2 = (f2 * inv).astype(x.dtype).astype(ct.float32) * w2.reshape((1, 1, 1, TR))
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
):
    """One block per token: per-head RMSNorm of q and k, then RoPE, written head-major."""
    t = ct.bid(0)
    seq = q.shape[1]
    b = t // seq
    s = t % seq
    cb = b * cos_batched
    _norm_rotate_store(q, q_weight, q_out, b, s, cb, cos, sin, eps, TQH, TR)
    _norm_rotate_store(k, k_weight, k_out, b, s, cb, cos, sin, eps, TKH, TR)


#: The default kernels: "tiled" (``ROPE_TOKENS`` / ``QK_TOKENS`` tokens per block; q, k and
#: cos/sin seen as (..., 2, R/2) views, so each half is a tile-aligned load whose offset the
#: compiler knows: 16-byte vector or TMA loads) or "token" (the first version: one block per
#: token, each half a ``slice`` at a run-time offset, which compiled to scalar 2-byte loads).
#: Swept on the H200 by benchmarks/ops/bench_rope.py (docs/results/h200-2026-11-29/ops/
#: norms_rope_tiled.txt): "tiled" wins only at many tokens (4x4096: rope 1.6 vs 1.2 TB/s,
#: qk-norm 1.3 vs 0.27 TB/s) and loses at the decode shapes that dominate generate() (8 tokens:
#: 63-87 us vs 17-27 us), so "token" stays the default until a per-size choice is measured.
ROPE_VARIANT = "token"
QK_VARIANT = "token"
#: Tokens per block and occupancy hint (resident blocks per SM, caps registers per thread;
#: ``None`` = the compiler's choice: 255 registers x 256 threads, one block per SM, for the
#: q/k-norm kernel; the rope kernel runs 128 threads and <= 202 registers either way).
ROPE_TOKENS = 4
ROPE_OCCUPANCY = 2
QK_TOKENS = 2
QK_OCCUPANCY = 4


#: Variants the benchmark sweeps and the GPU tests check: name -> keyword arguments of
#: ``apply_rope`` (``ROPE_VARIANTS``) / ``qk_norm_rope`` (``QK_VARIANTS``); "token" is the first
#: version.
ROPE_VARIANTS = {
    "token": dict(variant="token"),
    "t1-occ2": dict(variant="tiled", tokens=1, occupancy=2),
    "t2-occ2": dict(variant="tiled", tokens=2, occupancy=2),
    "t4-occ2": dict(variant="tiled", tokens=4, occupancy=2),
    "t8-occ2": dict(variant="tiled", tokens=8, occupancy=2),
    "t4-occ3": dict(variant="tiled", tokens=4, occupancy=3),
    "t8-occ1": dict(variant="tiled", tokens=8, occupancy=1),
}
QK_VARIANTS = {
    "token": dict(variant="token"),
    "t1-occ4": dict(variant="tiled", tokens=1, occupancy=4),
    "t2-occ2": dict(variant="tiled", tokens=2, occupancy=2),
    "t2-occ4": dict(variant="tiled", tokens=2, occupancy=4),
    "t4-occ2": dict(variant="tiled", tokens=4, occupancy=2),
    "t8-occ2": dict(variant="tiled", tokens=8, occupancy=2),
}


@ct.function
def _load_halves(x, idx0, idx1, idx2, shape):
    """The two halves (index 0 and 1 on axis 3) of a 5D (..., 2, R/2) view, as fp32 tiles."""
    x1 = ct.load(x, (idx0, idx1, idx2, 0, 0), shape, padding_mode=PAD_ZERO, latency=10)
    x2 = ct.load(x, (idx0, idx1, idx2, 1, 0), shape, padding_mode=PAD_ZERO, latency=10)
    return x1.astype(ct.float32), x2.astype(ct.float32)


@ct.function
def _store_rotated(out, b, sb, x1, x2, cs):
    """``x * cos + rotate_half(x) * sin`` of halves x1, x2 into the (B, H, S, 2, R/2) ``out``."""
    c1, c2, s1, s2 = cs
    ct.store(out, (b, 0, sb, 0, 0), (x1 * c1 - x2 * s1).astype(out.dtype))
    ct.store(out, (b, 0, sb, 1, 0), (x2 * c2 + x1 * s2).astype(out.dtype))


@ct.function
def _rope_heads(
    x, out, b, sb, cs, TH: ct.Constant[int], TS: ct.Constant[int], TR: ct.Constant[int]
):
    x1, x2 = _load_halves(x, b, 0, sb, (1, TH, TS, 1, TR))
    _store_rotated(out, b, sb, x1, x2, cs)


@ct.function
def _copy_heads(x, out, b, sb, TH: ct.Constant[int], TS: ct.Constant[int], TP: ct.Constant[int]):
    xp = ct.load(x, (b, 0, sb, 0), (1, TH, TS, TP), padding_mode=PAD_ZERO)
    ct.store(out, (b, 0, sb, 0), xp)


@ct.function
def _cos_sin_tile(cos, sin, cb, sb, TS: ct.Constant[int], TR: ct.Constant[int]):
    """(c1, c2, s1, s2): the halves of TS tokens' cos/sin, shaped (1, 1, TS, 1, TR)."""
    shape = (1, 1, TS, 1, TR)
    c1 = ct.load(cos, (cb, sb, 0, 0), (1, TS, 1, TR), padding_mode=PAD_ZERO)
    c2 = ct.load(cos, (cb, sb, 1, 0), (1, TS, 1, TR), padding_mode=PAD_ZERO)
    s1 = ct.load(sin, (cb, sb, 0, 0), (1, TS, 1, TR), padding_mode=PAD_ZERO)
    s2 = ct.load(sin, (cb, sb, 1, 0), (1, TS, 1, TR), padding_mode=PAD_ZERO)
    return (
        c1.astype(ct.float32).reshape(shape),
        c2.astype(ct.float32).reshape(shape),
        s1.astype(ct.float32).reshape(shape),
        s2.astype(ct.float32).reshape(shape),
    )


@ct.kernel(occupancy=ROPE_OCCUPANCY)
def rope_tiled_kernel(
    q,
    k,
    q_pass,
    k_pass,
    cos,
    sin,
    q_out,
    k_out,
    q_pass_out,
    k_pass_out,
    cos_batched,
    TQH: ct.Constant[int],
    TKH: ct.Constant[int],
    TS: ct.Constant[int],
    TR: ct.Constant[int],
    TP: ct.Constant[int],
):
    """TS tokens of one sequence per block, all q and k heads.

    q/k (and outputs) are (B, H, S, 2, R/2) views of the rotated part, cos/sin (B or 1, S, 2,
    R/2); q_pass/k_pass the (B, H, S, D - R) rest, copied when TP > 0.
    """
    nsb = ct.cdiv(q.shape[2], TS)
    b = ct.bid(0) // nsb
    sb = ct.bid(0) % nsb
    cs = _cos_sin_tile(cos, sin, b * cos_batched, sb, TS, TR)
    _rope_heads(q, q_out, b, sb, cs, TQH, TS, TR)
    _rope_heads(k, k_out, b, sb, cs, TKH, TS, TR)
    if TP > 0:
        _copy_heads(q_pass, q_pass_out, b, sb, TQH, TS, TP)
        _copy_heads(k_pass, k_pass_out, b, sb, TKH, TS, TP)


@ct.function
def _norm_rope_heads(
    x, w, out, b, sb, cs, eps, TH: ct.Constant[int], TS: ct.Constant[int], TR: ct.Constant[int]
):
    """RMSNorm each (token, head) row of a (B, S, H, 2, D/2) array, rotate, store (B, H, S, ...)."""
    d = 2 * x.shape[4]
    shape = (1, TH, TS, 1, TR)  # loaded head-major: tile axes 1, 2 are array axes 2, 1
    order = (0, 2, 1, 3, 4)
    x1 = ct.load(x, (b, 0, sb, 0, 0), shape, order=order, padding_mode=PAD_ZERO, latency=10)
    x2 = ct.load(x, (b, 0, sb, 1, 0), shape, order=order, padding_mode=PAD_ZERO, latency=10)
    x1, x2 = x1.astype(ct.float32), x2.astype(ct.float32)
    sq = ct.sum(x1 * x1, axis=4, keepdims=True) + ct.sum(x2 * x2, axis=4, keepdims=True)
    inv = ct.rsqrt(sq / d + eps)
    w1 = ct.load(w, (0, 0), (1, TR), padding_mode=PAD_ZERO).astype(ct.float32)
    w2 = ct.load(w, (1, 0), (1, TR), padding_mode=PAD_ZERO).astype(ct.float32)
    n1 = _norm_half(x1, inv, w1, x.dtype, out.dtype, TR)
    n2 = _norm_half(x2, inv, w2, x.dtype, out.dtype, TR)
    _store_rotated(out, b, sb, n1, n2, cs)


@ct.function
def _norm_half(xh, inv, wh, in_dtype, out_dtype, TR: ct.Constant[int]):
    """One half of the normed rows, with the module's roundings (fp32 tile)."""
    n = (xh * inv).astype(in_dtype).astype(ct.float32) * wh.reshape((1, 1, 1, 1, TR))
    return n.astype(out_dtype).astype(ct.float32)


@ct.kernel(occupancy=QK_OCCUPANCY)
def qk_norm_rope_tiled_kernel(
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
    TS: ct.Constant[int],
    TR: ct.Constant[int],
):
    """TS tokens per block: per-head RMSNorm of q and k, RoPE, written head-major.

    q/k are (B, S, H, 2, D/2) views, weights (2, D/2), cos/sin (B or 1, S, 2, D/2), outputs
    (B, H, S, 2, D/2) views of contiguous (B, H, S, D) tensors.
    """
    nsb = ct.cdiv(q.shape[1], TS)
    b = ct.bid(0) // nsb
    sb = ct.bid(0) % nsb
    cs = _cos_sin_tile(cos, sin, b * cos_batched, sb, TS, TR)
    _norm_rope_heads(q, q_weight, q_out, b, sb, cs, eps, TQH, TS, TR)
    _norm_rope_heads(k, k_weight, k_out, b, sb, cs, eps, TKH, TS, TR)


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
    """(..., D) -> (..., 2, rot/2) view of the rotated part (the two halves on their own axis)."""
    return t[..., :rot].unflatten(-1, (2, rot // 2))


def _tokens(tokens: int, seq: int) -> int:
    """Tokens per block: at most ``tokens``, no more than the sequence needs (decode: 1)."""
    return min(tokens, next_pow2(seq))


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    variant: str | None = None,
    tokens: int | None = None,
    occupancy=DEFAULT,
):
    """``apply_rotary_pos_emb(q, k, cos, sin)`` for (B, H, S, D) q/k (any strides).

    ``cos``/``sin`` are ``(B or 1, S, R)`` with ``R <= D`` (partial rotary: the rest of each
    head passes through). Returns new contiguous (B, H, S, D) tensors. ``variant``, ``tokens``
    and ``occupancy`` pick a kernel variant (defaults ``ROPE_VARIANT``, ``ROPE_TOKENS``,
    ``ROPE_OCCUPANCY``).
    """
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        check_activation(name, t)
    if q.dim() != 4 or k.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(f"q {tuple(q.shape)} / k {tuple(k.shape)} must be (B, H, S, D) alike")
    bsz, hq, seq, d = q.shape
    cos, sin, batched = _cos_sin(cos, sin, bsz, seq)
    rot = cos.shape[-1]
    if rot > d:
        raise ValueError(f"rotary dim {rot} exceeds head dim {d}")
    q, k = _last_contiguous(q), _last_contiguous(k)
    q_out = torch.empty((bsz, hq, seq, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((bsz, k.shape[1], seq, d), dtype=k.dtype, device=k.device)
    if not bsz * seq:
        return q_out, k_out
    if (variant or ROPE_VARIANT) == "token":
        consts = rope_constants(hq, k.shape[1], d, rot)
        args = (q, k, cos, sin, q_out, k_out, batched, *consts)
        ct.launch(stream(), (bsz * seq, 1, 1), rope_kernel, args)
        return q_out, k_out
    ts = _tokens(tokens or ROPE_TOKENS, seq)
    occ = ROPE_OCCUPANCY if occupancy is DEFAULT else occupancy
    tq, tk, tr, tp = rope_constants(hq, k.shape[1], d, rot)
    if tp:
        rest = (q[..., rot:], k[..., rot:], q_out[..., rot:], k_out[..., rot:])
    else:
        rest = (q, k, q_out, k_out)  # unused placeholders (TP == 0)
    rot_views = (_halves(q, rot), _halves(k, rot), *rest[:2], _halves(cos, rot))
    args = (*rot_views, _halves(sin, rot), _halves(q_out, rot), _halves(k_out, rot), *rest[2:])
    grid = (bsz * ((seq + ts - 1) // ts), 1, 1)
    kernel = with_occupancy(rope_tiled_kernel, occ, ROPE_OCCUPANCY)
    ct.launch(stream(), grid, kernel, (*args, batched, tq, tk, ts, tr, tp))
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
    variant: str | None = None,
    tokens: int | None = None,
    occupancy=DEFAULT,
):
    """Qwen3's ``q_norm``/``k_norm`` (per head) + transpose + RoPE, q and k in one launch.

    ``q``/``k`` are the projections viewed ``(B, S, H, D)`` (any strides, e.g. slices of a
    fused QKV output); returns contiguous ``(B, H, S, D)`` q and k. Full rotary only.
    ``variant``, ``tokens``, ``occupancy``: as for :func:`apply_rope` (``QK_*`` defaults).
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
    out_dtype = torch.promote_types(q.dtype, q_weight.dtype)
    q_out = torch.empty((bsz, hq, seq, d), dtype=out_dtype, device=q.device)
    k_out = torch.empty((bsz, hk, seq, d), dtype=out_dtype, device=q.device)
    if not bsz * seq:
        return q_out, k_out
    qw, kw = q_weight.contiguous(), k_weight.contiguous()
    tq, tk, tr = next_pow2(hq), next_pow2(hk), next_pow2(d // 2)
    if (variant or QK_VARIANT) == "token":
        args = (q, k, qw, kw, cos, sin, q_out, k_out, float(eps), batched, tq, tk, tr)
        ct.launch(stream(), (bsz * seq, 1, 1), qk_norm_rope_kernel, args)
        return q_out, k_out
    ts = _tokens(tokens or QK_TOKENS, seq)
    occ = QK_OCCUPANCY if occupancy is DEFAULT else occupancy
    views = [_halves(t, d) for t in (q, k, qw, kw, cos, sin, q_out, k_out)]
    grid = (bsz * ((seq + ts - 1) // ts), 1, 1)
    kernel = with_occupancy(qk_norm_rope_tiled_kernel, occ, QK_OCCUPANCY)
    ct.launch(stream(), grid, kernel, (*views, float(eps), batched, tq, tk, ts, tr))
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


def qk_norm_rope_reference(q, k, q_weight, k_weight, eps, cos, sin):
    """Qwen3Attention: ``q_norm(q).transpose(1, 2)`` etc., then ``apply_rotary_pos_emb``."""
    from tilegym.ops.rms_norm import rms_norm_reference

    qn = rms_norm_reference(q, q_weight, eps).transpose(1, 2)
    kn = rms_norm_reference(k, k_weight, eps).transpose(1, 2)
    return apply_rope_reference(qn, kn, cos, sin)


def default_rope_kernel():
    """The RoPE kernel ``apply_rope`` launches by default (``ROPE_VARIANT``)."""
    return rope_kernel if ROPE_VARIANT == "token" else rope_tiled_kernel


def default_qk_kernel():
    """The q/k-norm + RoPE kernel ``qk_norm_rope`` launches by default (``QK_VARIANT``)."""
    return qk_norm_rope_kernel if QK_VARIANT == "token" else qk_norm_rope_tiled_kernel


def _token_counts(tokens: int) -> list[int]:
    """Every tokens-per-block value ``_tokens`` can pick: powers of two up to ``tokens``."""
    return [1 << i for i in range(tokens.bit_length()) if 1 << i <= tokens]


def aot_signatures(
    heads=((16, 8, 128), (32, 8, 64)), dtypes=AOT_DTYPES, partial_rot=((32, 8, 64, 32),)
) -> dict:
    """AOT signatures of the default kernels: (q heads, kv heads, head dim) of Qwen3-0.6B and
    Llama-3.2-1B, plus a partial-rotary layout; every tokens-per-block value."""
    plain, fused = [], []
    i32, f32 = ScalarConstraint(ct.int32), ScalarConstraint(ct.float32)
    layouts = [(hq, hk, d, d) for hq, hk, d in heads] + list(partial_rot)
    for dt in dtypes:
        a5, a4, a3, a2, a1 = (array_sig(dt, n) for n in (5, 4, 3, 2, 1))
        for hq, hk, d, rot in layouts:
            consts = rope_constants(hq, hk, d, rot)
            if ROPE_VARIANT == "token":
                plain.append(signature(a4, a4, a3, a3, a4, a4, i32, *consts))
            else:
                for ts in _token_counts(ROPE_TOKENS):
                    arrays = (a5, a5, a4, a4, a4, a4, a5, a5, a4, a4)
                    plain.append(signature(*arrays, i32, consts[0], consts[1], ts, *consts[2:]))
        for hq, hk, d in heads:
            tiles = (next_pow2(hq), next_pow2(hk), next_pow2(d // 2))
            if QK_VARIANT == "token":
                fused.append(signature(a4, a4, a1, a1, a3, a3, a4, a4, f32, i32, *tiles))
            else:
                for ts in _token_counts(QK_TOKENS):
                    arrays = (a5, a5, a2, a2, a4, a4, a5, a5)
                    fused.append(signature(*arrays, f32, i32, *tiles[:2], ts, tiles[2]))
    return {default_rope_kernel(): plain, default_qk_kernel(): fused}
