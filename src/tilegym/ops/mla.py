"""Multi-head latent attention (DeepSeek V2/V3) decode over the compressed latent cache.

transformers' ``DeepseekV2Attention`` caches, per token, the normed latent ``c_kv`` (``[B, 1,
T, L]``, L = ``kv_lora_rank`` = 512; the cache layer's keys) and the shared rotated key
``k_pe`` (``[B, 1, T, R]``, R = ``qk_rope_head_dim`` = 64; the layer's values), then expands
them every step through ``kv_b_proj`` into per-head keys ``[k_nope_h, k_pe]`` (192 wide) and
values (128 wide): ``T * H * (192 + 128)`` activations rebuilt and read per layer and step.

With ``kv_b_proj``'s weight viewed as ``[H, N + V, L]`` (``W_UK = [:, :N]``, ``W_UV = [:,
N:]``) the same attention is, per head ``h`` (the "absorbed" form serving engines use):

- ``q_lat[h] = q_nope[h] @ W_UK[h]`` (``[L]``), so ``q_nope[h] . k_nope_h[t] = q_lat[h] .
  c_kv[t]``;
- ``s[h, t] = (q_lat[h] . c_kv[t] + q_pe[h] . k_pe[t]) * scale``, softmax over ``t``;
- ``ctx[h] = sum_t p[h, t] c_kv[t]`` (``[L]``) and the head's output ``ctx[h] @ W_UV[h]^T``.

This module is the middle step: ``mla_decode`` reads only the cache (``T * (L + R)`` values per
sequence, shared by every head) and returns ``ctx`` ``[B, H, L]``. It is MQA with one 576-wide
key and its first 512 columns as the value: one (batch, head block, key split) block loads a
latent tile once and uses it for both MMAs (keys on the MMA rows, as the shared decode's
``cols`` form). Splits are combined by the shared ``decode_reduce_kernel`` at ``D = L``.

``mla_prefill`` is the prompt's causal attention over expanded keys and values, as upstream
computes it (the latent through ``kv_b_proj``): one flash kernel whose key is the head's
``k_nope`` (128) plus the shared ``k_pe`` (64) in two MMAs, and whose value is 128 wide. The
shared prefill kernel takes one head width for q, k and v from 64/96/128/256; padding 192 and
128 to 256 would have cost a copy of q, k and v and a third more MMA work, so this is a
variant beside it (the shared kernel's signatures stay as they are).

The decode key range is ``[0, kv_end)`` or, for a static cache's captured decode step, ``[0,
position[0]]`` read on the device; ``key_valid`` ``[B, T]`` drops padding keys. Rows with no
visible key give 0. The scale is the module's ``scaling`` (DeepSeek-V3's YaRN mscale included).
"""

from __future__ import annotations

import math

import cuda.tile as ct
import torch

from tilegym.ops import attention as _att
from tilegym.ops._common import stream, with_occupancy

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
LOG2E = _att.LOG2E
_ZERO = ct.PaddingMode.ZERO
_NEG_BIG = -1.0e30

MLA_TILE_N = 64
"""Keys per tile: a 64 x 512 bf16 latent tile is 64 KiB (plus 8 KiB of rope keys)."""
MLA_HEAD_BLOCK = 16
"""Query heads per block (the MMA's N side): DeepSeek-V2-Lite's 16 heads in one block, so its
latent cache is read once per split; V3's 128 heads take 8 blocks."""
MLA_MIN_SPLIT_TILES = 2
"""A split covers at least this many key tiles (fewer and the combine costs more than it saves)."""


class MlaInputError(ValueError):
    """Inputs outside what the MLA decode kernel handles."""


@ct.kernel
def mla_decode_kernel(
    QL,
    QPE,
    CKV,
    KPE,
    OPart,
    LsePart,
    Out,
    KeyValid,
    Pos,
    qk_scale: float,
    kv_end: int,
    tiles_per_split: int,
    DL: ConstInt,
    DR: ConstInt,
    HB: ConstInt,
    TILE_N: ConstInt,
    HAS_PAD: ConstBool,
    BY_POSITION: ConstBool,
    PARTS: ConstBool,
):
    """One (batch * head block, key split) block: online softmax of ``HB`` heads over a range
    of latent keys; the latent tile is both the key (with the rope tile) and the value."""
    nhb = ct.cdiv(QL.shape[1], HB)
    b = ct.bid(0) // nhb
    hb = ct.bid(0) % nhb
    s = ct.bid(1)

    end = kv_end
    if BY_POSITION:
        end = ct.minimum(ct.gather(Pos, 0) + 1, CKV.shape[2])
    j0 = s * tiles_per_split
    j1 = ct.minimum(j0 + tiles_per_split, ct.cdiv(end, TILE_N))

    ql = ct.load(QL, index=(b, hb, 0), shape=(1, HB, DL), padding_mode=_ZERO).reshape((HB, DL))
    qp = ct.load(QPE, index=(b, hb, 0), shape=(1, HB, DR), padding_mode=_ZERO).reshape((HB, DR))
    ql_t = ct.transpose(ql)  # (DL, HB)
    qp_t = ct.transpose(qp)  # (DR, HB)
    offs = ct.arange(TILE_N, dtype=ct.int32)[:, None]
    m_i = ct.full((1, HB), _NEG_BIG, dtype=ct.float32)
    l_i = ct.full((1, HB), 0.0, dtype=ct.float32)
    acc = ct.full((DL, HB), 0.0, dtype=ct.float32)
    for j in range(j0, j1):
        c = ct.load(
            CKV, index=(b, 0, j, 0), shape=(1, 1, TILE_N, DL), padding_mode=_ZERO, latency=4
        ).reshape((TILE_N, DL))
        kp = ct.load(
            KPE, index=(b, 0, j, 0), shape=(1, 1, TILE_N, DR), padding_mode=_ZERO, latency=4
        ).reshape((TILE_N, DR))
        qk = ct.mma(c, ql_t, ct.full((TILE_N, HB), 0.0, dtype=ct.float32))
        qk = ct.mma(kp, qp_t, qk)
        ok = j * TILE_N + offs < end
        if HAS_PAD:
            kv_ok = ct.load(KeyValid, index=(b, j), shape=(1, TILE_N), padding_mode=_ZERO)
            ok = ok & (kv_ok.reshape((TILE_N, 1)) != 0)
        qk = ct.where(ok, qk * qk_scale, -math.inf)
        m_new = ct.maximum(m_i, ct.max(qk, axis=0, keepdims=True))
        p = ct.exp2(qk - m_new, flush_to_zero=True)
        alpha = ct.exp2(m_i - m_new, flush_to_zero=True)
        l_i = l_i * alpha + ct.sum(p, axis=0, keepdims=True)
        acc = acc * alpha
        if BY_POSITION:
            c = ct.where(ok, c, 0.0)  # slots past the position may hold stale values
        acc = ct.mma(ct.transpose(c), p.astype(CKV.dtype), acc)
        m_i = m_new
    l_safe = ct.where(l_i == 0.0, 1.0, l_i)
    o = ct.transpose(acc / l_safe)  # (HB, DL)
    if PARTS:
        lse = ct.where(l_i == 0.0, -math.inf, m_i + ct.log2(l_safe))
        ct.store(OPart, index=(b, hb, s, 0), tile=o.reshape((1, HB, 1, DL)))
        ct.store(LsePart, index=(b, hb, s), tile=lse.reshape((1, HB, 1)))
    else:
        ct.store(Out, index=(b, hb, 0), tile=o.reshape((1, HB, DL)).astype(Out.dtype))


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _check(q_latent, q_pe, ckv, kpe) -> tuple[int, int, int, int, int]:
    if q_latent.ndim != 3 or q_pe.ndim != 3 or ckv.ndim != 4 or kpe.ndim != 4:
        raise MlaInputError(
            "q_latent [B, H, L], q_pe [B, H, R], ckv [B, 1, T, L] and kpe [B, 1, T, R] expected, "
            f"got {tuple(q_latent.shape)}, {tuple(q_pe.shape)}, {tuple(ckv.shape)}, "
            f"{tuple(kpe.shape)}"
        )
    b, h, dl = q_latent.shape
    dr, t = q_pe.shape[2], ckv.shape[2]
    if q_pe.shape[:2] != (b, h) or ckv.shape != (b, 1, t, dl) or kpe.shape != (b, 1, t, dr):
        raise MlaInputError(
            f"shapes do not fit: q_latent {tuple(q_latent.shape)}, q_pe {tuple(q_pe.shape)}, "
            f"ckv {tuple(ckv.shape)}, kpe {tuple(kpe.shape)}"
        )
    if not (_pow2(dl) and _pow2(dr) and dl >= 16 and dr >= 16):
        raise MlaInputError(f"latent width {dl} and rope width {dr} must be powers of two >= 16")
    dtypes = {x.dtype for x in (q_latent, q_pe, ckv, kpe)}
    if len(dtypes) != 1 or q_latent.dtype not in (torch.bfloat16, torch.float16):
        raise MlaInputError(f"dtypes {sorted(map(str, dtypes))}: need one of bf16/fp16 for all")
    if not all(x.is_cuda for x in (q_latent, q_pe, ckv, kpe)):
        raise MlaInputError("cuTile MLA decode needs CUDA tensors")
    return b, h, dl, dr, t


def plan_mla_splits(blocks: int, span: int, num_sms: int, tile_n: int = MLA_TILE_N) -> tuple:
    """``(splits, tiles_per_split)`` for ``blocks`` (batch * head blocks) over ``span`` keys:
    one wave of blocks (one per SM), at least ``MLA_MIN_SPLIT_TILES`` tiles a split, at most 64
    splits (the reduction's widest tile). A second wave cost more than it hid on the H200 (batch
    8, 4K keys: 37.1 us at two waves, 29.1 at one; ``benchmarks/ops/sweep_mla.py``): the kernel
    keeps one block per SM, and every split adds a 32 KiB fp32 partial to write and reduce."""
    tiles = max(1, -(-span // tile_n))
    splits = _att.plan_splits(blocks, tiles, num_sms, min_tiles=MLA_MIN_SPLIT_TILES, waves=1)
    per = max(1, -(-tiles // splits))
    return max(1, -(-tiles // per)), per


def mla_decode(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    ckv: torch.Tensor,
    kpe: torch.Tensor,
    *,
    scale: float,
    kv_end: int | None = None,
    position: torch.Tensor | None = None,
    key_valid: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    occupancy: int | None = None,
    tile_n: int = MLA_TILE_N,
) -> torch.Tensor:
    """Latent context ``[B, H, L]`` of one new token per sequence over keys ``[0, kv_end)``
    (default: all ``T``) or ``[0, position[0]]`` (int32 ``[1]`` on the device; no host read),
    minus the keys ``key_valid`` ``[B, T]`` marks invalid. ``num_splits``, ``occupancy`` (blocks
    per SM hinted to the compiler) and ``tile_n`` (keys a tile) override the plan, for sweeps
    and tests."""
    b, h, dl, dr, t = _check(q_latent, q_pe, ckv, kpe)
    if kv_end is not None and position is not None:
        raise MlaInputError("give kv_end or position, not both")
    by_position = position is not None
    if by_position and (position.shape != (1,) or position.dtype != torch.int32):
        raise MlaInputError(
            f"position must be an int32 tensor of shape (1,), got {position.dtype} "
            f"{tuple(position.shape)}"
        )
    kv_end = t if kv_end is None else int(kv_end)
    if not 0 <= kv_end <= t:
        raise MlaInputError(f"kv_end {kv_end} outside [0, {t}]")
    if out is not None and (out.shape != (b, h, dl) or out.dtype != q_latent.dtype):
        raise MlaInputError(f"out must be {(b, h, dl)} {q_latent.dtype}")
    q_latent, q_pe, ckv, kpe = (_att._unit_last_stride(x) for x in (q_latent, q_pe, ckv, kpe))
    kv_arg = _att._key_valid_arg(key_valid, b, t)
    hb = MLA_HEAD_BLOCK
    nhb = -(-h // hb)
    span = t if by_position else kv_end
    if num_splits:
        tiles = max(1, -(-span // tile_n))
        per = max(1, -(-tiles // int(num_splits)))
        splits = max(1, -(-tiles // per))
    else:
        splits, per = plan_mla_splits(b * nhb, span, _att.sm_count(q_latent.device), tile_n)
    if out is None:
        out = torch.empty((b, h, dl), dtype=q_latent.dtype, device=q_latent.device)
    dev = q_latent.device
    parts = splits > 1
    n_o = b * h * splits * dl if parts else dl
    buf = torch.empty((n_o + (b * h * splits if parts else 1),), dtype=torch.float32, device=dev)
    o_part = buf[:n_o].view((b, h, splits, dl) if parts else (1, 1, 1, dl))
    lse_part = buf[n_o:].view((b, h, splits) if parts else (1, 1, 1))
    args = (
        q_latent,
        q_pe,
        ckv,
        kpe,
        o_part,
        lse_part,
        out,
        kv_arg if kv_arg is not None else _att._dummy_mask(dev),
        position if by_position else _att._dummy_lens_for(dev),
        float(scale) * LOG2E,
        kv_end,
        per,
        dl,
        dr,
        hb,
        tile_n,
        kv_arg is not None,
        by_position,
        parts,
    )
    launch_stream = stream()
    kernel = with_occupancy(mla_decode_kernel, occupancy, None)
    ct.launch(launch_stream, (b * nhb, splits, 1), kernel, args)
    if parts:
        red = (
            o_part.view(b * h, splits, dl),
            lse_part.view(b * h, splits),
            out.view(b * h, dl),
            dl,
            _att._next_pow2(splits),
            True,
        )
        ct.launch(
            launch_stream,
            (b * h, 1, 1),
            _att.decode_reduce_kernel,
            red,
            programmatic_dependent_launch=True,
        )
    return out


# --------------------------------------------------------------------------------------------
# Prefill over expanded keys and values (qk head 192 = nope 128 + rope 64, v head 128)
# --------------------------------------------------------------------------------------------

MLA_PREFILL_TILE_M = 64
MLA_PREFILL_TILE_N = 64


@ct.kernel(occupancy=1)
def mla_prefill_kernel(
    QN,
    QP,
    KN,
    KP,
    V,
    Out,
    KeyValid,
    qk_scale: float,
    q_start: int,
    DN: ConstInt,
    DR: ConstInt,
    DV: ConstInt,
    HQ: ConstInt,
    TILE_M: ConstInt,
    TILE_N: ConstInt,
    HAS_PAD: ConstBool,
):
    """One (query tile, batch * head) block of causal attention whose key is the head's
    ``k_nope`` and the shared ``k_pe`` (two MMAs, no concatenated or padded 192-wide copy) and
    whose value is ``DV`` wide: the flash prefill with split keys and its own value width."""
    num_m = ct.num_blocks(0)
    bm = num_m - 1 - ct.bid(0)  # heaviest causal tiles first
    bh = ct.bid(1)
    b = bh // HQ
    h = bh % HQ
    skv = KN.shape[2]
    q_lo = bm * TILE_M
    rows = q_lo + q_start + ct.arange(TILE_M, dtype=ct.int32)[:, None]
    col_tile = ct.arange(TILE_N, dtype=ct.int32)[None, :]
    qn = ct.load(QN, index=(b, h, bm, 0), shape=(1, 1, TILE_M, DN), padding_mode=_ZERO)
    qp = ct.load(QP, index=(b, h, bm, 0), shape=(1, 1, TILE_M, DR), padding_mode=_ZERO)
    qn = qn.reshape((TILE_M, DN))
    qp = qp.reshape((TILE_M, DR))
    m_i = ct.full((TILE_M, 1), _NEG_BIG, dtype=ct.float32)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    acc = ct.full((TILE_M, DV), 0.0, dtype=ct.float32)
    kv_hi = min(skv, q_lo + q_start + TILE_M)
    j_full_hi = min(skv // TILE_N, (q_lo + q_start + 1) // TILE_N)
    for j in range(0, ct.cdiv(kv_hi, TILE_N)):
        kn = ct.load(
            KN,
            index=(b, h, 0, j),
            shape=(1, 1, DN, TILE_N),
            order=(0, 1, 3, 2),
            padding_mode=_ZERO,
            latency=2,
        ).reshape((DN, TILE_N))
        kp = ct.load(
            KP,
            index=(b, 0, 0, j),
            shape=(1, 1, DR, TILE_N),
            order=(0, 1, 3, 2),
            padding_mode=_ZERO,
            latency=2,
        ).reshape((DR, TILE_N))
        qk = ct.mma(qn, kn, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
        qk = ct.mma(qp, kp, qk)
        if HAS_PAD or j >= j_full_hi:
            cols = j * TILE_N + col_tile
            ok = (cols < skv) & (cols <= rows)
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
            V, index=(b, h, j, 0), shape=(1, 1, TILE_N, DV), padding_mode=_ZERO, latency=4
        ).reshape((TILE_N, DV))
        acc = ct.mma(p.astype(QN.dtype), v, acc)
        m_i = m_new
    l_safe = ct.where(l_i == 0.0, 1.0, l_i)
    acc = acc / l_safe
    ct.store(Out, index=(b, h, bm, 0), tile=acc.reshape((1, 1, TILE_M, DV)).astype(Out.dtype))


def _check_prefill(q_nope, q_pe, k_nope, k_pe, v) -> tuple[int, int, int, int, int]:
    if any(x.ndim != 4 for x in (q_nope, q_pe, k_nope, k_pe, v)):
        raise MlaInputError("q_nope, q_pe, k_nope, k_pe and v must be 4D [B, heads, seq, dim]")
    b, h, s, dn = q_nope.shape
    dr, t, dv = q_pe.shape[3], k_nope.shape[2], v.shape[3]
    if (
        q_pe.shape != (b, h, s, dr)
        or k_nope.shape != (b, h, t, dn)
        or k_pe.shape != (b, 1, t, dr)
        or v.shape != (b, h, t, dv)
    ):
        raise MlaInputError(
            f"shapes do not fit: q_nope {tuple(q_nope.shape)}, q_pe {tuple(q_pe.shape)}, "
            f"k_nope {tuple(k_nope.shape)}, k_pe {tuple(k_pe.shape)}, v {tuple(v.shape)}"
        )
    if not all(_pow2(d) and d >= 16 for d in (dn, dr, dv)):
        raise MlaInputError(f"head widths nope {dn}, rope {dr}, v {dv} must be powers of two >= 16")
    dtypes = {x.dtype for x in (q_nope, q_pe, k_nope, k_pe, v)}
    if len(dtypes) != 1 or q_nope.dtype not in (torch.bfloat16, torch.float16):
        raise MlaInputError(f"dtypes {sorted(map(str, dtypes))}: need one of bf16/fp16 for all")
    if not all(x.is_cuda for x in (q_nope, q_pe, k_nope, k_pe, v)):
        raise MlaInputError("cuTile MLA prefill needs CUDA tensors")
    return b, h, s, t, dv


def mla_prefill(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    k_nope: torch.Tensor,
    k_pe: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    q_start: int | None = None,
    key_valid: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of ``S`` new tokens (query row ``i`` sees keys ``j <= i + q_start``,
    default ``T - S``; ``key_valid`` ``[B, T]`` drops padding keys) with keys ``[k_nope_h,
    k_pe]`` and values ``v``: returns ``[B, S, H, DV]`` (transformers' output layout)."""
    b, h, s, t, dv = _check_prefill(q_nope, q_pe, k_nope, k_pe, v)
    q_start = t - s if q_start is None else int(q_start)
    if q_start < 0:
        raise MlaInputError(f"causal attention needs q_start >= 0, got {q_start}")
    tensors = [_att._unit_last_stride(x) for x in (q_nope, q_pe, k_nope, k_pe, v)]
    kv_arg = _att._key_valid_arg(key_valid, b, t)
    if out is None:
        out = torch.empty((b, s, h, dv), dtype=q_nope.dtype, device=q_nope.device)
    tm, tn = MLA_PREFILL_TILE_M, MLA_PREFILL_TILE_N
    args = (
        *tensors,
        out.transpose(1, 2),
        kv_arg if kv_arg is not None else _att._dummy_mask(q_nope.device),
        float(scale) * LOG2E,
        q_start,
        q_nope.shape[3],
        q_pe.shape[3],
        dv,
        h,
        tm,
        tn,
        kv_arg is not None,
    )
    ct.launch(stream(), (-(-s // tm), b * h, 1), mla_prefill_kernel, args)
    return out


# --------------------------------------------------------------------------------------------
# PyTorch references
# --------------------------------------------------------------------------------------------


def visible_keys(
    b: int,
    t: int,
    *,
    kv_end: int | None = None,
    position: torch.Tensor | None = None,
    key_valid: torch.Tensor | None = None,
    device=None,
) -> torch.Tensor:
    """Boolean ``[B, T]``: which keys the new token sees (the kernel's key range and padding)."""
    end = t if kv_end is None else int(kv_end)
    if position is not None:
        end = min(int(position[0]) + 1, t)
    ok = (torch.arange(t, device=device) < end).expand(b, t).clone()
    if key_valid is not None:
        ok &= key_valid.to(device=device, dtype=torch.bool)
    return ok


def reference_mla_decode(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    ckv: torch.Tensor,
    kpe: torch.Tensor,
    visible: torch.Tensor,
    scale: float,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``mla_decode`` in ``dtype`` (fp32 or fp64): ``[B, H, L]``; rows with no visible key 0."""
    ql, qp = q_latent.to(dtype), q_pe.to(dtype)
    c, kp = ckv[:, 0].to(dtype), kpe[:, 0].to(dtype)
    s = (torch.einsum("bhl,btl->bht", ql, c) + torch.einsum("bhr,btr->bht", qp, kp)) * scale
    vis = visible.to(torch.bool)[:, None, :]
    s = s.masked_fill(~vis, -math.inf)
    any_key = vis.any(dim=-1, keepdim=True)
    p = torch.softmax(s.masked_fill(~any_key, 0.0), dim=-1).masked_fill(~vis, 0.0)
    return torch.einsum("bht,btl->bhl", p, c)


def reference_mla_prefill(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    k_nope: torch.Tensor,
    k_pe: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``mla_prefill`` in ``dtype`` with a dense boolean mask ``[B, 1, S, T]``: keys
    ``[k_nope, k_pe]``, values ``v``; rows with no visible key give 0. ``[B, S, H, DV]``."""
    h = q_nope.shape[1]
    q = torch.cat([q_nope, q_pe], dim=-1).to(dtype)
    k = torch.cat([k_nope, k_pe.expand(-1, h, -1, -1)], dim=-1).to(dtype)
    s = (q @ k.transpose(2, 3)) * scale
    any_key = mask.any(dim=-1, keepdim=True)
    s = s.masked_fill(~mask, -math.inf).masked_fill(~any_key, 0.0)
    p = torch.softmax(s, dim=-1).masked_fill(~mask, 0.0)
    return (p @ v.to(dtype)).transpose(1, 2)


def split_kv_b_weight(weight: torch.Tensor, num_heads: int, nope_dim: int, v_dim: int):
    """``kv_b_proj.weight`` ``[H * (N + V), L]`` as ``(W_UK [H, N, L], W_UV [H, V, L])`` views."""
    if weight.ndim != 2 or weight.shape[0] != num_heads * (nope_dim + v_dim):
        raise MlaInputError(
            f"kv_b_proj weight {tuple(weight.shape)} is not "
            f"[{num_heads} * ({nope_dim} + {v_dim}), L]"
        )
    w = weight.view(num_heads, nope_dim + v_dim, weight.shape[1])
    return w[:, :nope_dim], w[:, nope_dim:]


def absorb_query(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """``q_nope`` ``[B, H, N]`` through ``W_UK`` ``[H, N, L]``: ``q_latent`` ``[B, H, L]``."""
    return torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)


def latent_to_heads(ctx: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """``ctx`` ``[B, H, L]`` through ``W_UV`` ``[H, V, L]``: per-head outputs ``[B, H, V]``."""
    return torch.bmm(ctx.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)


# --------------------------------------------------------------------------------------------
# AOT signatures
# --------------------------------------------------------------------------------------------


def mla_decode_signatures(latent: int = 512, rope: int = 64, dtype=ct.bfloat16) -> list:
    """The decode kernel's variants: one split or parts, with and without padding, by
    ``kv_end`` (dynamic cache) and by device position (static cache)."""
    from cuda.tile.compilation import ScalarConstraint

    arr, i32 = _att.array_constraint, ScalarConstraint(ct.int32)
    head = [arr(dtype, 3), arr(dtype, 3), arr(dtype, 4), arr(dtype, 4)]
    head += [arr(ct.float32, 4), arr(ct.float32, 3), arr(dtype, 3)]
    head += [arr(ct.int8, 2), arr(ct.int32, 1), ScalarConstraint(ct.float32), i32, i32]
    consts = [latent, rope, MLA_HEAD_BLOCK, MLA_TILE_N]
    return [
        _att._sig(head + consts + [pad, pos, parts])
        for parts in (True, False)
        for pos in (False, True)
        for pad in (True, False)
    ]


def mla_prefill_signatures(heads: int, nope: int, rope: int, v_dim: int, dtype=ct.bfloat16):
    """The prefill kernel with and without padding."""
    from cuda.tile.compilation import ScalarConstraint

    arr = _att.array_constraint
    head = [arr(dtype, 4)] * 6 + [arr(ct.int8, 2), ScalarConstraint(ct.float32)]
    head += [ScalarConstraint(ct.int32), nope, rope, v_dim, heads]
    return [
        _att._sig(head + [MLA_PREFILL_TILE_M, MLA_PREFILL_TILE_N, pad]) for pad in (True, False)
    ]


def aot_signatures(
    latent: int = 512, rope: int = 64, heads: int = 16, nope: int = 128, v_dim: int = 128
) -> dict:
    """``{kernel: [KernelSignature, ...]}`` at DeepSeek-V2-Lite's widths (16 heads, latent 512,
    rope 64, nope 128, v 128): the decode kernel, the shared split reduction at ``D = latent``
    and the prefill kernel."""
    red = [
        _att._sig(
            [_att.array_constraint(ct.float32, 3), _att.array_constraint(ct.float32, 2)]
            + [_att.array_constraint(ct.bfloat16, 2), latent, nsp, True]
        )
        for nsp in (2, 4, 8, 16, 32, 64)
    ]
    return {
        mla_decode_kernel: mla_decode_signatures(latent, rope),
        _att.decode_reduce_kernel: red,
        mla_prefill_kernel: mla_prefill_signatures(heads, nope, rope, v_dim),
    }
