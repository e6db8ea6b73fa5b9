"""OLMo's q/k RMSNorm over the whole projection, fused with RoPE: q and k in one launch.

OLMo 2, OLMo 3 and OLMoE normalize the q projection as one ``Hq * D``-wide row (and k as one
``Hk * D``-wide row), not per head as Qwen3 does, then view it per head and rotate. Unfused
that is two whole-width RMSNorm launches and one RoPE launch a layer; at decode the RoPE
launch was the per-token kernel (one block on one SM, scalar 2-byte loads: see
``tilegym.ops.rope``), 11.2 us of olmo3's 16 us a layer on the H200.

Here each block owns (a group of TH heads of q or of k) x (a tile of TS tokens): it first sums
the squares of its tokens' whole rows (read as (TS, TC heads, D) tiles: the row is only 8 KB
at olmo3's 32 x 128, so every head group re-reads it from L2), then norms, rotates and stores
its own heads one at a time as the "loop" kernels of ``tilegym.ops.rope`` do: each half of a
head is tile 0 or 1 of extent D/2 on the last axis (no slice at a run-time offset, so 16-byte
loads), cos/sin loaded once per block, each output half in its own array (no barriers).

Numerics, by ``round_once``: True is ``Olmo2RMSNorm``/``Olmo3RMSNorm`` (fp32 normalized row
times the weight, rounded once to the input dtype; their ``apply_rotary_pos_emb`` rotates in
fp32 with fp32 tables and rounds back to that dtype); False is ``OlmoeRMSNorm`` (Llama's: the
normalized row rounded to the input dtype, times the weight, rounded to the promoted dtype).
The norm's rounding before the rotation is kept (``round_norm``) so the result is upstream's;
the rotation itself is fp32, rounded once (OLMoE's bf16 tables: upstream rounds each product).
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
from tilegym.ops.rope import (
    _cos_sin,
    _cs_tiles,
    _halves_out,
    _last_contiguous,
    _ld_head,
    _loop_grid,
    _token_counts,
    _tokens,
    apply_rope_reference,
)

#: Launch shape by token count (batch x seq): up to ``DECODE_MAX`` tokens ``DECODE_HEADS`` heads
#: per block (olmo3 decode: 8 + 8 blocks a sequence instead of one), above ``PREFILL_HEADS`` (a
#: whole projection per block at olmo3's 32 heads: its row tile is read twice, the second time
#: from L1, instead of once per head group). ``TOKENS`` per block at most (decode: 1).
DECODE_MAX = 32
DECODE_HEADS = 4
PREFILL_HEADS = 32
TOKENS = 8
#: fp32 elements of one sum-of-squares tile (TS tokens x TC heads x D): the whole olmo3 row at
#: decode, 4 heads x 8 tokens in a prefill block; bounds the registers the first pass needs.
SS_ELEMS = 4096
LATENCY = 1
OCCUPANCY = 3

#: Launch shapes the benchmark sweeps and the GPU tests check (keyword arguments of
#: ``qk_norm_whole_rope``); "auto" is the default dispatch above. "h*" = heads per block,
#: "t*" = tokens per block; "noround" skips the norm's rounding before the rotation (closer to
#: fp32 than upstream, not upstream's numerics: measured only, never the default).
VARIANTS = {
    "auto": dict(),
    "h2-t1": dict(heads=2, tokens=1),
    "h8-t1": dict(heads=8, tokens=1),
    "h32-t1": dict(heads=32, tokens=1),
    "h8-t8": dict(heads=8, tokens=8),
    "h16-t8": dict(heads=16, tokens=8),
    "h32-t16": dict(heads=32, tokens=16),
    "h32-t4": dict(heads=32, tokens=4),
    "auto-noround": dict(round_norm=False),
}


@ct.function
def _sum_squares(x, b, sb, TS: ct.Constant[int], TC: ct.Constant[int], TR: ct.Constant[int], LAT):
    """Sum of squares of the whole (H * D) rows of token tile ``sb`` of a (B, S, H, D) array
    (D = 2 TR), fp32 (1, TS, 1, 1), read TC heads (both halves) at a time."""
    ss = ct.full((1, TS, 1, 1), 0.0, dtype=ct.float32)
    for j in range(ct.cdiv(x.shape[2], TC)):
        t1 = _ld_head(x, (b, sb, j), 0, TS, TC, TR, LAT)
        t2 = _ld_head(x, (b, sb, j), 1, TS, TC, TR, LAT)
        sq = ct.sum(t1 * t1, axis=3, keepdims=True) + ct.sum(t2 * t2, axis=3, keepdims=True)
        ss = ss + ct.sum(sq, axis=2, keepdims=True)
    return ss


@ct.function
def _normed(xn, w, in_dtype, out_dtype, ROUND_ONCE: ct.Constant[bool], ROUND: ct.Constant[bool]):
    """One half of a normalized fp32 head times its fp32 weight half, with upstream's rounding
    (module docstring); ROUND rounds it to the norm's output dtype before the rotation."""
    if not ROUND_ONCE:
        xn = xn.astype(in_dtype).astype(ct.float32)
    y = xn * w
    if ROUND:
        y = y.astype(out_dtype).astype(ct.float32)
    return y


@ct.function
def _whole_norm_rope(
    x,
    w,
    lo,
    hi,
    b,
    h0,
    sb,
    cs,
    eps,
    TH: ct.Constant[int],
    TS: ct.Constant[int],
    TR: ct.Constant[int],
    TC: ct.Constant[int],
    LAT: ct.Constant[int],
    ROUND_ONCE: ct.Constant[bool],
    ROUND: ct.Constant[bool],
):
    """Norm (over all heads) + rotate heads ``h0 .. h0 + TH - 1`` of token tile ``sb`` of a
    (B, S, H, D) array with its (H, D) weight; store them into the (B, H, S, D/2) halves."""
    nh = x.shape[2]
    inv = ct.rsqrt(_sum_squares(x, b, sb, TS, TC, TR, LAT) / (nh * 2 * TR) + eps)
    c1, c2, s1, s2 = cs
    for h in range(h0, min(h0 + TH, nh)):
        x1 = _ld_head(x, (b, sb, h), 0, TS, 1, TR, LAT)
        x2 = _ld_head(x, (b, sb, h), 1, TS, 1, TR, LAT)
        w1 = ct.load(w, (h, 0), (1, TR), padding_mode=PAD_ZERO, allow_tma=False)
        w2 = ct.load(w, (h, 1), (1, TR), padding_mode=PAD_ZERO, allow_tma=False)
        w1 = w1.astype(ct.float32).reshape((1, 1, 1, TR))
        w2 = w2.astype(ct.float32).reshape((1, 1, 1, TR))
        n1 = _normed(x1 * inv, w1, x.dtype, lo.dtype, ROUND_ONCE, ROUND)
        n2 = _normed(x2 * inv, w2, x.dtype, lo.dtype, ROUND_ONCE, ROUND)
        o1 = (n1 * c1 - n2 * s1).astype(lo.dtype).reshape((1, 1, TS, TR))
        o2 = (n2 * c2 + n1 * s2).astype(hi.dtype).reshape((1, 1, TS, TR))
        ct.store(lo, (b, h, sb, 0), o1, allow_tma=False)
        ct.store(hi, (b, h, sb, 0), o2, allow_tma=False)


@ct.kernel(occupancy=OCCUPANCY)
def qk_norm_whole_rope_kernel(
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
    TC: ct.Constant[int],
    LAT: ct.Constant[int],
    ROUND_ONCE: ct.Constant[bool],
    ROUND: ct.Constant[bool],
):
    """Grid (q head groups + k head groups, token tiles, batch). q/k (B, S, H, D) with D/2 a
    power of two, weights (H, D) (the whole-projection weight viewed per head), cos/sin
    (B or 1, S, D); ``*_lo``/``*_hi`` the (B, H, S, D/2) halves of the head-major outputs."""
    g = ct.bid(0)
    sb = ct.bid(1)
    b = ct.bid(2)
    nq = ct.cdiv(q.shape[2], TH)
    cs = _cs_tiles(cos, sin, b * cos_batched, sb, (1, TS, 1, TR), TS, TR)
    if g < nq:
        _whole_norm_rope(
            q, q_weight, q_lo, q_hi, b, g * TH, sb, cs, eps, TH, TS, TR, TC, LAT, ROUND_ONCE, ROUND
        )
    else:
        h0 = (g - nq) * TH
        _whole_norm_rope(
            k, k_weight, k_lo, k_hi, b, h0, sb, cs, eps, TH, TS, TR, TC, LAT, ROUND_ONCE, ROUND
        )


def fits(head_dim: int) -> bool:
    """Whether the kernel takes heads of ``head_dim``: each half a power-of-two tile (every OLMo
    model: 128); others keep the unfused path."""
    half = head_dim // 2
    return head_dim % 2 == 0 and half > 0 and next_pow2(half) == half


def launch_shape(hq: int, hk: int, d: int, bsz: int, seq: int, heads=None, tokens=None):
    """(TH, TS, TC): heads per block, tokens per block, heads per sum-of-squares tile."""
    default = DECODE_HEADS if bsz * seq <= DECODE_MAX else PREFILL_HEADS
    th = min(heads or default, max(hq, hk))
    ts = _tokens(tokens or TOKENS, seq)
    tc = min(next_pow2(max(hq, hk)), max(1, SS_ELEMS // (ts * d)))
    return th, ts, tc


def out_dtype(x: torch.dtype, w: torch.dtype, round_once: bool) -> torch.dtype:
    """The outputs' dtype: the input's (Olmo2RMSNorm's ``.to(input_dtype)``, and its RoPE casts
    back to it), or the promoted one (OlmoeRMSNorm's ``weight * x.to(input_dtype)``)."""
    return x if round_once else torch.promote_types(x, w)


def qk_norm_whole_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    round_once: bool = True,
    round_norm: bool = True,
    heads: int | None = None,
    tokens: int | None = None,
    latency: int | None = None,
    occupancy=DEFAULT,
):
    """``q_norm``/``k_norm`` over the whole projections, view per head, transpose, RoPE.

    ``q``/``k`` are the projections viewed ``(B, S, H, D)`` (any strides with a unit last one,
    e.g. slices of a fused QKV output); ``q_weight``/``k_weight`` are ``(Hq * D,)`` /
    ``(Hk * D,)``; cos/sin ``(B or 1, S, D)`` (full rotary only). Returns contiguous
    ``(B, H, S, D)`` q and k. ``heads``/``tokens`` per block, ``latency``/``occupancy`` hints
    and ``round_norm`` are for the benchmark's sweep (``VARIANTS``).
    """
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        check_activation(name, t)
    if q.dim() != 4 or k.dim() != 4 or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} / k {tuple(k.shape)} must be (B, S, H, D) alike")
    bsz, seq, hq, d = q.shape
    hk = k.shape[2]
    if not fits(d):
        raise ValueError(f"head dim {d}: each half must be a power of two")
    cos, sin, batched = _cos_sin(cos, sin, bsz, seq)
    if cos.shape[-1] != d:
        raise ValueError(f"full rotary only: cos dim {cos.shape[-1]} vs head dim {d}")
    if q_weight.shape != (hq * d,) or k_weight.shape != (hk * d,):
        raise ValueError(f"q/k norm weights must be ({hq * d},) and ({hk * d},)")
    q, k = _last_contiguous(q), _last_contiguous(k)
    dtype = out_dtype(q.dtype, q_weight.dtype, round_once)
    q_out = torch.empty((bsz, hq, seq, d), dtype=dtype, device=q.device)
    k_out = torch.empty((bsz, hk, seq, d), dtype=dtype, device=q.device)
    if not bsz * seq:
        return q_out, k_out
    qw = q_weight.contiguous().view(hq, d)
    kw = k_weight.contiguous().view(hk, d)
    th, ts, tc = launch_shape(hq, hk, d, bsz, seq, heads, tokens)
    occ = OCCUPANCY if occupancy is DEFAULT else occupancy
    kernel = with_occupancy(qk_norm_whole_rope_kernel, occ, OCCUPANCY)
    outs = (*_halves_out(q_out, d), *_halves_out(k_out, d))
    consts = (th, ts, d // 2, tc, latency or LATENCY, bool(round_once), bool(round_norm))
    args = (q, k, qw, kw, cos, sin, *outs, float(eps), batched, *consts)
    ct.launch(stream(), _loop_grid(th, ts, hq, hk, seq, bsz), kernel, args)
    return q_out, k_out


def whole_rms_norm_reference(x, weight, eps, round_once: bool = True):
    """``Olmo2RMSNorm.forward`` (``round_once``) or ``OlmoeRMSNorm.forward`` on the last axis."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if round_once:
        return (weight * h).to(input_dtype)
    return weight * h.to(input_dtype)


def qk_norm_whole_rope_reference(q, k, q_weight, k_weight, eps, cos, sin, round_once=True):
    """Upstream's attention steps on (B, S, H, D) projections: the whole-width norms, the
    per-head view, the transpose and ``apply_rotary_pos_emb`` (OLMo 2/3's casts the rotation
    back to the normed dtype; OLMoE's has no cast: equal with its tables in the same dtype)."""
    b, s, hq, d = q.shape
    hk = k.shape[2]
    qn = whole_rms_norm_reference(q.reshape(b, s, hq * d), q_weight, eps, round_once)
    kn = whole_rms_norm_reference(k.reshape(b, s, hk * d), k_weight, eps, round_once)
    qn, kn = qn.view(b, s, hq, d).transpose(1, 2), kn.view(b, s, hk, d).transpose(1, 2)
    qo, ko = apply_rope_reference(qn, kn, cos, sin)
    return (qo.to(qn.dtype), ko.to(kn.dtype)) if round_once else (qo, ko)


def aot_signatures(
    heads=((32, 32, 128), (16, 16, 128)),
    dtypes=AOT_DTYPES,
    cos_dtypes=(torch.float32,),
    round_once=(True,),
) -> dict:
    """Signatures of every launch the default dispatch makes at the (q heads, kv heads, head
    dim) layouts (OLMo 3 7B, OLMo 2 1B / OLMoE): both head-group sizes, every tokens-per-block
    value, activations in ``dtypes``, tables in ``cos_dtypes`` (OLMo 2/3 hand fp32 tables)."""
    i32, f32 = ScalarConstraint(ct.int32), ScalarConstraint(ct.float32)
    sigs, seen = [], set()  # two layouts may launch alike (one symbol each: no duplicates)
    for (hq, hk, d), dt, cdt, once in (
        (h, dt, c, o) for h in heads for dt in dtypes for c in cos_dtypes for o in round_once
    ):
        a4, a2, c3 = array_sig(dt, 4), array_sig(dt, 2), array_sig(cdt, 3)
        outs = (array_sig(out_dtype(dt, dt, once), 4),) * 4
        for ts in _token_counts(TOKENS):
            for th in sorted({min(DECODE_HEADS, max(hq, hk)), min(PREFILL_HEADS, max(hq, hk))}):
                tc = min(next_pow2(max(hq, hk)), max(1, SS_ELEMS // (ts * d)))
                consts = (th, ts, d // 2, tc, LATENCY, once, True)
                if (dt, cdt, consts) not in seen:
                    seen.add((dt, cdt, consts))
                    sigs.append(signature(a4, a4, a2, a2, c3, c3, *outs, f32, i32, *consts))
    return {qk_norm_whole_rope_kernel: sigs}
