"""Causal depthwise conv1d + SiLU (Qwen3.5 / Qwen3-Next linear attention) with its cache state.

Semantics of transformers' ``causal_conv1d_fn`` (prefill) and ``causal_conv1d_update`` (decode)
with ``activation="silu"``: per channel c, ``out[t] = silu(bias[c] + sum_j w[c, j] x[t-K+1+j])``,
the conv rounded to the input dtype before the SiLU, as the bf16 ``F.conv1d`` output is. Inputs
before t = 0 come from the conv state (the last ``S`` inputs of the previous call, transformers'
``[B, C, S]`` cache layout, S >= K - 1) or are zero. The kernel also writes the new state (the
last S inputs of the concatenation, zero-filled when the sequence is shorter), which may be the
same tensor as the old one (decode): only the blocks of the first time tile read the old state
and they alone write the new one, for their own channels, through the same array parameter.

Layout ``[B, T, C]`` (the projection's output, no transpose to ``[B, C, T]``); one kernel for
both stages: prefill launches 16-token tiles, decode 1-token tiles.
"""

from __future__ import annotations

import cuda.tile as ct
import torch
import torch.nn.functional as F

from tilegym.ops._common import (
    AOT_DTYPES,
    array_sig,
    check_activation,
    next_pow2,
    signature,
    stream,
)

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

TILE_T = 16
TILE_C = 256


@ct.kernel
def causal_conv1d_kernel(
    X,
    Wt,
    Bias,
    State,
    StateOut,
    Out,
    TT: ConstInt,
    TC: ConstInt,
    KW: ConstInt,
    KS: ConstInt,
    KSP: ConstInt,
    HAS_BIAS: ConstBool,
    HAS_STATE: ConstBool,
    WRITE_STATE: ConstBool,
    IN_PLACE: ConstBool,
):
    """One (time tile, channel tile, batch) block of the conv; the first time tile also
    writes the new state of its channels: into ``State`` itself with IN_PLACE (the reads and
    the write then go through one array, so the compiler keeps them in program order; two
    array parameters holding one tensor would be taken for two), else into ``StateOut``."""
    bt = ct.bid(0)
    bc = ct.bid(1)
    b = ct.bid(2)
    n_tok = X.shape[1]
    t = bt * TT + ct.arange(TT, dtype=ct.int32).reshape((TT, 1))
    c = bc * TC + ct.arange(TC, dtype=ct.int32).reshape((1, TC))
    acc = ct.zeros((TT, TC), dtype=ct.float32)
    if HAS_BIAS:
        acc = acc + ct.gather(Bias, c).astype(ct.float32)
    for j in ct.static_iter(range(KW)):
        src = t - (KW - 1) + j
        xs = ct.gather(X, (b, src, c), mask=src >= 0).astype(ct.float32)
        if HAS_STATE:
            old = ct.gather(State, (b, c, src + KS), mask=src < 0)
            xs = xs + old.astype(ct.float32)
        wj = ct.gather(Wt, (c, j)).astype(ct.float32)
        acc = acc + wj * xs
    conv = acc.astype(X.dtype).astype(ct.float32)
    ct.store(
        Out, (b, bt, bc), (conv / (1.0 + ct.exp(-conv))).astype(Out.dtype).reshape((1, TT, TC))
    )
    if WRITE_STATE:  # noqa: SIM102 (a compile-time flag, then a block test)
        if bt == 0:
            m = ct.arange(KSP, dtype=ct.int32).reshape((KSP, 1))
            src = n_tok - KS + m
            cs = bc * TC + ct.arange(TC, dtype=ct.int32).reshape((1, TC))
            keep = m < KS
            new = ct.gather(X, (b, src, cs), mask=keep & (src >= 0))
            if HAS_STATE:
                old = ct.gather(State, (b, cs, src + KS), mask=keep & (src < 0))
                new = ct.where(src < 0, old.astype(X.dtype), new)
            if IN_PLACE:
                ct.scatter(State, (b, cs, m), new.astype(State.dtype), mask=keep)
            else:
                ct.scatter(StateOut, (b, cs, m), new.astype(StateOut.dtype), mask=keep)


def _launch(x, weight, bias, state_in, state_out, tile_t):
    check_activation("x", x)
    bsz, n_tok, ch = x.shape
    if x.stride(-1) != 1:
        raise ValueError("x needs a unit last stride")
    if weight.dim() != 2 or weight.shape[0] != ch:
        raise ValueError(f"weight {tuple(weight.shape)} must be [C, K] with C = {ch}")
    if weight.dtype != x.dtype:
        raise ValueError(f"weight dtype {weight.dtype} must be x's ({x.dtype})")
    kw = weight.shape[1]
    for name, s in (("state_in", state_in), ("state_out", state_out)):
        if s is not None and (s.shape[:2] != (bsz, ch) or s.shape[2] < kw - 1):
            raise ValueError(f"{name} {tuple(s.shape)} must be [B, C, >= K-1]")
    out = torch.empty((bsz, n_tok, ch), dtype=x.dtype, device=x.device)
    if not (bsz and n_tok and ch):
        return out
    states = [s for s in (state_in, state_out) if s is not None]
    if len(states) == 2 and state_in.shape != state_out.shape:
        raise ValueError("state_in and state_out must have one shape")
    ks = states[0].shape[2] if states else kw
    w = weight.contiguous()
    b = bias.contiguous() if bias is not None else w
    si = state_in if state_in is not None else w
    so = state_out if state_out is not None else w
    tc = min(TILE_C, next_pow2(ch))
    grid = (-(-n_tok // tile_t), -(-ch // tc), bsz)
    consts = (tile_t, tc, kw, ks, next_pow2(ks), bias is not None)
    in_place = state_in is not None and state_out is not None and state_in is state_out
    if in_place:
        so = w  # placeholder: the kernel writes through ``State``
    elif state_in is not None and state_out is not None and _overlap(state_in, state_out):
        raise ValueError("state_in and state_out overlap without being one tensor")
    flags = (state_in is not None, state_out is not None, in_place)
    ct.launch(stream(), grid, causal_conv1d_kernel, (x, w, b, si, so, out, *consts, *flags))
    return out


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    sa, sb = a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr()
    return sa == sb


def causal_conv1d(x, weight, bias=None, state_in=None, state_out=None):
    """Prefill: ``silu(causal depthwise conv(x))`` for x ``[B, T, C]``, weight ``[C, K]``;
    inputs before the sequence from ``state_in`` (zeros if None); the last inputs written to
    ``state_out`` ``[B, C, S]`` if given (may be ``state_in`` itself)."""
    return _launch(x, weight, bias, state_in, state_out, TILE_T)


def causal_conv1d_update(x, conv_state, weight, bias=None):
    """Decode: the conv of the new tokens of x ``[B, T, C]`` (T = 1 usually) against the cached
    inputs in ``conv_state`` ``[B, C, S]``, which is shifted in place."""
    tile_t = min(TILE_T, next_pow2(x.shape[1]))
    return _launch(x, weight, bias, conv_state, conv_state, tile_t)


def causal_conv1d_reference(x, weight, bias=None, state=None):
    """transformers' computation in PyTorch on ``[B, T, C]``: ``(out, new state)``; the state
    is the last S inputs of ``cat(state or zeros, x)`` (S = K when no state is given)."""
    bsz, n_tok, ch = x.shape
    kw = weight.shape[1]
    xt = x.transpose(1, 2)
    hist = state if state is not None else x.new_zeros(bsz, ch, kw)
    full = torch.cat([hist.to(x.dtype), xt], dim=-1)
    conv = F.conv1d(full.to(weight.dtype), weight.unsqueeze(1), bias, groups=ch)
    out = F.silu(conv[..., -n_tok:]).to(x.dtype).transpose(1, 2)
    return out, full[..., -hist.shape[-1] :]


def aot_signatures(channels=(6144, 8192), dtypes=AOT_DTYPES, kernel_size=4) -> dict:
    """Signatures of prefill (16-token tiles, no state in, state out) and decode (1-token tiles,
    state in place) for Qwen3.5's conv widths (0.8B: 2*16*128 + 16*128; 16/32 heads: 8192)."""
    sigs = []
    for dt in dtypes:
        a3, a2 = array_sig(dt, 3), array_sig(dt, 2)
        for tc in sorted({min(TILE_C, next_pow2(ch)) for ch in channels}):  # one per tile
            ks, ksp = kernel_size, next_pow2(kernel_size)
            shape = (kernel_size, ks, ksp, False)
            prefill = (a3, a2, a2, a2, a3, a3, TILE_T, tc, *shape, False, True, False)
            decode = (a3, a2, a2, a3, a2, a3, 1, tc, *shape, True, True, True)
            sigs += [signature(*prefill), signature(*decode)]
    return {causal_conv1d_kernel: sigs}
