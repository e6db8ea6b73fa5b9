"""Attention with sinks (gpt-oss): a learned per-head logit joins each row's softmax and is then
dropped, so ``out = sum_j p_j v_j / (sum_j exp(s_j) + exp(sink_h))`` (``GptOssAttention.sinks``;
transformers' eager ``eager_attention_forward`` of ``modeling_gpt_oss``).

New kernel variants beside ``tilegym.ops.attention`` (whose kernels and AOT signatures stay as
they are for every other family):

- prefill: ``prefill_attention_sinks_kernel`` is the flash prefill kernel with the sink as the
  online softmax's starting state (running max ``sink``, running sum ``exp(sink - sink) = 1``,
  accumulator 0): the sink is a key with a zero value, seen before the first key tile. Rows
  with no visible key give 0 (the sink takes all the weight), as upstream's padded rows do.
- decode: the shared split-KV ``decode_attention_kernel`` writes partial outputs and
  log-sum-exps (``EPI_PARTS``, one split included) and ``decode_sinks_reduce_kernel`` combines
  them with the sink term in the denominator. With ``SINK_EPILOGUE`` a one-split plan (short
  caches, windows, large batches) instead puts the sink in the kernel's output epilogue
  (``EPI_SINK``): one launch, as without sinks. (Partials for every plan cost a second launch
  and the partials' round trip: 12.8 against 6.9 us without sinks at batch 8 and 128-key
  windows on an H200.) No host read: a static cache's decode step (``position`` on the device)
  is captured as it is for the shared decode.

Masking, layouts and head dims are ``tilegym.ops.attention``'s. The sinks are ``[Hq]`` in the
activations' dtype (the module's parameter), read once per block and widened to fp32.
"""

from __future__ import annotations

import math

import cuda.tile as ct
import torch
from cuda.tile import RoundingMode as RMd

from tilegym.ops import attention as _att
from tilegym.ops._common import stream, with_occupancy

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
LOG2E = _att.LOG2E
_ZERO = ct.PaddingMode.ZERO
#: a one-split decode takes the sink in its epilogue (``EPI_SINK``) instead of partials and the
#: sink reduction: 8.4 against 13.2 us at batch 8 and 128 keys on an H100 (SDPA: 10.6).
SINK_EPILOGUE = True


@ct.kernel(occupancy=1)
def prefill_attention_sinks_kernel(
    Q,
    K,
    V,
    Out,
    KeyValid,
    Sinks,
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
    """One (query tile, batch*head) block: online softmax seeded with the head's sink."""
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

    sink = ct.astype(ct.gather(Sinks, h), ct.float32) * LOG2E  # log2 units, like qk * qk_scale
    m_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32) + sink
    l_i = ct.full((TILE_M, 1), 1.0, dtype=ct.float32)
    acc = ct.full((TILE_M, D), 0.0, dtype=ct.float32)

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

    # l_i >= 1: the largest term of the sum (a key's or the sink's) is exp2(0)
    acc = ct.truediv(acc, l_i, flush_to_zero=True, rounding_mode=RMd.APPROX)
    ct.store(Out, index=(b, h, bm, 0), tile=acc.reshape((1, 1, TILE_M, D)).astype(Out.dtype))


@ct.kernel
def decode_sinks_reduce_kernel(
    OPart, LsePart, Sinks, Out, HQ: ConstInt, D: ConstInt, NSP: ConstInt, PDL: ConstBool
):
    """Combine one (batch, query head)'s per-split outputs by their log-sum-exp, with the
    head's sink in the denominator: ``sum_s w_s o_s / (sum_s w_s + exp2(sink - m))``."""
    r = ct.bid(0)
    if PDL:
        ct.grid_dependency_control_wait()
    sink = ct.astype(ct.gather(Sinks, r % HQ), ct.float32) * LOG2E
    lse = ct.load(LsePart, index=(r, 0), shape=(1, NSP), padding_mode=ct.PaddingMode.NEG_INF)
    lse = lse.reshape((NSP, 1))
    o = ct.load(OPart, index=(r, 0, 0), shape=(1, NSP, D), padding_mode=_ZERO).reshape((NSP, D))
    m = ct.maximum(ct.max(lse, axis=0, keepdims=True), sink)  # finite: the sink is
    w = ct.exp2(lse - m, flush_to_zero=True)
    den = ct.sum(w, axis=0, keepdims=True) + ct.exp2(sink - m, flush_to_zero=True)
    num = ct.sum(o * w, axis=0, keepdims=True)
    ct.store(Out, index=(r, 0), tile=(num / den).astype(Out.dtype))


def _sinks_arg(sinks: torch.Tensor, hq: int, dtype: torch.dtype) -> torch.Tensor:
    if sinks.shape != (hq,):
        raise _att.AttentionInputError(f"sinks shape {tuple(sinks.shape)} != {(hq,)}")
    if sinks.device.type != "cuda":
        raise _att.AttentionInputError("sinks must be a CUDA tensor")
    return sinks.detach().to(dtype).contiguous()


def prefill_attention_sinks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = True,
    q_start: int | None = None,
    window: int | None = None,
    key_valid: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``tilegym.ops.attention.prefill_attention`` with per-head sinks ``[Hq]``;
    returns ``[B, Sq, Hq, D]``."""
    b, hq, hkv = _att._check_common(q, k, v)
    sq, d = q.shape[2], q.shape[3]
    skv = k.shape[2]
    q_start = skv - sq if q_start is None else q_start
    if causal and q_start < 0:
        raise _att.AttentionInputError(f"causal attention needs q_start >= 0, got {q_start}")
    if window is not None and window <= 0:
        raise _att.AttentionInputError(f"sliding window must be positive, got {window}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    cfg = _att.default_prefill_config(d)
    q, k, v = (_att._unit_last_stride(t) for t in (q, k, v))
    kv_arg = _att._key_valid_arg(key_valid, b, skv)
    if out is None:
        out = torch.empty((b, sq, hq, d), dtype=q.dtype, device=q.device)
    args = (
        q,
        k,
        v,
        out.transpose(1, 2),
        kv_arg if kv_arg is not None else _att._dummy_mask(q.device),
        _sinks_arg(sinks, hq, q.dtype),
        scale * LOG2E,
        int(q_start),
        int(window or 0),
        _att.head_tile(d),
        hq,
        hq // hkv,
        cfg.tile_m,
        cfg.tile_n,
        bool(causal),
        window is not None,
        kv_arg is not None,
    )
    kernel = with_occupancy(prefill_attention_sinks_kernel, cfg.occupancy, 1)
    ct.launch(stream(), (ct.cdiv(sq, cfg.tile_m), b * hq, 1), kernel, args)
    return out


def sinks_config(cfg: tuple, epilogue: bool = SINK_EPILOGUE) -> tuple:
    """The shared decode kernel's config ``(GP, TILE_N, SLIDING, HAS_PAD, LENS, ROWS, EPI)``
    with sinks: with ``epilogue`` a one-split plan's output epilogue takes the sink
    (``EPI_SINK``); otherwise, and for a split plan, partial outputs for
    ``decode_sinks_reduce_kernel``."""
    one = cfg[6] == _att.EPI_OUT
    epi = _att.EPI_SINK if one and epilogue else _att.EPI_PARTS
    return (*cfg[:6], epi)


def decode_attention_sinks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor,
    *,
    scale: float | None = None,
    kv_end: int | None = None,
    position: torch.Tensor | None = None,
    window: int | None = None,
    key_valid: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    sink_epilogue: bool = SINK_EPILOGUE,
) -> torch.Tensor:
    """``tilegym.ops.attention.decode_attention`` (keys ``[0, kv_end)`` or ``[0, position[0]]``)
    with per-head sinks ``[Hq]``; returns ``[B, 1, Hq, D]``. ``sink_epilogue``: see
    ``SINK_EPILOGUE``."""
    b, hq, hkv = _att._check_common(q, k, v)
    if q.shape[2] != 1:
        raise _att.AttentionInputError(f"decode takes one query token, got {q.shape[2]}")
    d, skv = q.shape[3], k.shape[2]
    kv_end = skv if kv_end is None else int(kv_end)
    if not 0 <= kv_end <= skv:
        raise _att.AttentionInputError(f"kv_end {kv_end} outside [0, {skv}]")
    if window is not None and window <= 0:
        raise _att.AttentionInputError(f"sliding window must be positive, got {window}")
    lens, span, lens_arg = _att.LENS_NONE, kv_end, None
    if position is not None:
        if position.shape != (1,) or position.dtype != torch.int32:
            raise _att.AttentionInputError("position must be an int32 tensor of shape (1,)")
        lens, span, lens_arg = _att.LENS_POSITION, skv, position
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    k, v = _att._unit_last_stride(k), _att._unit_last_stride(v)
    qg = q.reshape(b, hkv, group, d)
    qg = qg if qg.stride(-1) == 1 else qg.contiguous()
    kv_arg = _att._key_valid_arg(key_valid, b, skv)
    sm = _att.sm_count(q.device)
    plan, cfg = _att._decode_config(
        b * hkv, span, d, group, sm, window, kv_arg is not None, lens, *(None,) * 7
    )
    splits = plan.splits
    cfg = sinks_config(cfg, sink_epilogue)
    if out is None:
        out = torch.empty((b, 1, hq, d), dtype=q.dtype, device=q.device)
    sinks_arg = _sinks_arg(sinks, hq, q.dtype)
    if cfg[6] == _att.EPI_SINK:
        o_part, lse_part = _att._placeholders(q.device)
    else:
        n_o = b * hq * splits * d
        parts = torch.empty((n_o + b * hq * splits,), dtype=torch.float32, device=q.device)
        o_part = parts[:n_o].view(b, hkv, group, splits, d)
        lse_part = parts[n_o:].view(b, hkv, group, splits)
    launch_stream = stream()
    args = (
        qg,
        k,
        v,
        o_part,
        lse_part,
        out.view(b, hkv, group, d),
        kv_arg if kv_arg is not None else _att._dummy_mask(q.device),
        lens_arg if lens_arg is not None else _att._dummy_lens_for(q.device),
        sinks_arg,
        scale * LOG2E,
        kv_end,
        int(window or 0),
        plan.tiles_per_split,
        _att.head_tile(d),
        *cfg,
    )
    kernel = with_occupancy(_att.decode_attention_kernel, plan.occupancy, None)
    ct.launch(launch_stream, (b * hkv, splits, 1), kernel, args)
    if cfg[6] == _att.EPI_SINK:
        return out
    pdl = plan.scheme == "pdl"
    args = (
        o_part.view(b * hq, splits, d),
        lse_part.view(b * hq, splits),
        sinks_arg,
        out.view(b * hq, d),
        hq,
        _att.head_tile(d),
        _att._next_pow2(splits),
        pdl,
    )
    ct.launch(
        launch_stream,
        (b * hq, 1, 1),
        decode_sinks_reduce_kernel,
        args,
        programmatic_dependent_launch=pdl,
    )
    return out


def reference_attention_sinks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    sinks: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """fp32 attention with sinks, a dense boolean mask ``[B, 1, Sq, Skv]`` and GQA, as
    gpt-oss's eager attention computes it (masked keys get no weight; a row with no visible
    key gives 0). Returns ``[B, Sq, Hq, D]``."""
    group = q.shape[1] // k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    logits = (q.float() @ kf.transpose(2, 3)) * scale
    logits = logits.masked_fill(~mask, -math.inf)
    sink = sinks.float().reshape(1, -1, 1, 1).expand(*logits.shape[:3], 1)
    probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
    return (probs @ vf).transpose(1, 2)


# --------------------------------------------------------------------------------------------
# AOT signatures
# --------------------------------------------------------------------------------------------


def prefill_sinks_signatures(head_dim: int, num_q_heads: int, group: int, dtype=ct.bfloat16):
    """The shared prefill variants (causal; + padding; + window), each with the sinks array."""
    from cuda.tile.compilation import ScalarConstraint

    cfg = _att.default_prefill_config(head_dim)
    arr = _att.array_constraint
    sigs = []
    for sliding, pad in ((False, False), (False, True), (True, False), (True, True)):
        params = [arr(dtype, 4)] * 4 + [arr(ct.int8, 2), arr(dtype, 1)]
        params += [ScalarConstraint(ct.float32), ScalarConstraint(ct.int32)]
        params += [ScalarConstraint(ct.int32), _att.head_tile(head_dim), num_q_heads, group]
        params += [cfg.tile_m, cfg.tile_n, True, sliding, pad]
        sigs.append(_att._sig(params))
    return sigs


def decode_sinks_signatures(
    head_dim: int, num_q_heads: int, group: int, dtype=ct.bfloat16, epilogue=(SINK_EPILOGUE,)
):
    """The shared decode kernel's variants this module launches (each decode config of
    ``decode_kernel_configs`` as ``sinks_config`` makes it, with and without the window, for
    each ``epilogue`` setting) and the sink reduction at every split count the plan takes."""
    from cuda.tile.compilation import ScalarConstraint

    arr, i32 = _att.array_constraint, ScalarConstraint(ct.int32)
    head = [arr(dtype, 4)] * 3 + [arr(ct.float32, 5), arr(ct.float32, 4), arr(dtype, 4)]
    rest = [arr(ct.int8, 2), arr(ct.int32, 1), arr(dtype, 1), ScalarConstraint(ct.float32)]
    rest += [i32, i32, i32]
    configs = _att.decode_kernel_configs(head_dim, group)
    cfgs = {sinks_config(c, e) for c in configs for e in epilogue}
    cfgs |= {(*c[:2], True, *c[3:]) for c in cfgs if c[4] == _att.LENS_NONE and c[3]}
    dec = [_att._sig(head + rest + [_att.head_tile(head_dim), *c]) for c in sorted(cfgs)]
    red = [
        _att._sig(
            [arr(ct.float32, 3), arr(ct.float32, 2), arr(dtype, 1), arr(dtype, 2)]
            + [num_q_heads, _att.head_tile(head_dim), nsp, pdl]
        )
        for nsp in (1, 2, 4, 8, 16, 32, 64)
        for pdl in (False, True)
    ]
    return {_att.decode_attention_kernel: dec, decode_sinks_reduce_kernel: red}


def aot_signatures(head_dim: int = 64, num_q_heads: int = 64, num_kv_heads: int = 8):
    """``{kernel: [KernelSignature, ...]}`` (default: gpt-oss-20b's heads)."""
    group = num_q_heads // num_kv_heads
    sigs = {prefill_attention_sinks_kernel: prefill_sinks_signatures(head_dim, num_q_heads, group)}
    sigs.update(decode_sinks_signatures(head_dim, num_q_heads, group))
    return sigs
