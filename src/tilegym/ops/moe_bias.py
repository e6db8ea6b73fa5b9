"""Mixture-of-experts experts with biased GEMMs and a clamped gated activation (gpt-oss), in
cuTile, on ``tilegym.ops.moe``'s dispatch, row gather and combine.

``GptOssExperts.forward`` (+ the decoder layer's residual add), per (token t, slot j), expert
``e = ids[t, j]``: ``[g; u] = gate_up[e] @ x_t + gate_up_bias[e]``, ``g = min(g, limit)``,
``u = clamp(u, -limit, limit)``, ``a = g * sigmoid(alpha * g) * (u + 1)``,
``y = down[e] @ a + down_bias[e]``; ``out_t = residual_t + sum_j w[t, j] * y``.

The kernels take the experts in ``tilegym.ops.moe``'s row layout: ``gate_up`` ``[E, 2I, H]``
(the gate rows, then the up rows), ``down`` ``[E, H, I]``; biases ``[E, 2I]`` and ``[E, H]``.
gpt-oss stores ``gate_up_proj`` ``[E, H, 2I]`` with gate and up interleaved (even, odd
columns) and ``down_proj`` ``[E, I, H]``; ``expert_rows`` lays them out once (the model glue
keeps the copy, built at patch time).

New kernels (the shared ones keep their signatures): ``tilegym_moe_gate_up_bias_kernel`` is
the grouped gate/up GEMM with the bias added to both fp32 accumulators and the activation
(``ACT``: ``ACT_SILU``, or ``ACT_CLAMPED`` with ``alpha``/``limit``) in its epilogue;
``tilegym_moe_down_bias_kernel`` is the grouped down GEMM with the expert's bias added to the
accumulator before its one rounding. Tiles, dispatch and swap are ``tilegym.ops.moe``'s.
"""

from __future__ import annotations

import math
from dataclasses import replace

import cuda.tile as ct
import torch
from cuda.tile.compilation import ScalarConstraint

from tilegym.ops import moe as _moe
from tilegym.ops._common import PAD_ZERO, aligned_array_sig, signature, stream

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

ACT_SILU = 0
"""``silu(g) * u`` (biased SwiGLU)."""
ACT_CLAMPED = 1
"""gpt-oss: ``min(g, limit) * sigmoid(alpha * min(g, limit)) * (clamp(u, +-limit) + 1)``."""


def _bias(B, e, bn, BN, BM, SWAP):
    """Expert e's bias columns [bn*BN, +BN) shaped to the accumulator ((BM, BN) or swapped)."""
    b = ct.astype(ct.load(B, (e, bn), (1, BN), padding_mode=PAD_ZERO), ct.float32)
    return ct.reshape(b, (BN, 1)) if SWAP else b


@ct.kernel
def tilegym_moe_gate_up_bias_kernel(
    Xs,
    BlockExpert,
    Wg,
    Wu,
    Bg,
    Bu,
    A,
    alpha: float,
    limit: float,
    BM: ConstInt,
    BN: ConstInt,
    TK: ConstInt,
    SWAP: ConstBool,
    DIRECT_K: ConstInt,
    ACT: ConstInt,
):
    """A[block rows, bn tile] = act(Xs @ Wg[e]^T + Bg[e], Xs @ Wu[e]^T + Bu[e]); grid (blocks,
    I tiles); rows and ``DIRECT_K`` as ``tilegym.ops.moe.tilegym_moe_gate_up_kernel``."""
    b = ct.bid(0)
    bn = ct.bid(1)
    e = ct.gather(BlockExpert, b)
    if _moe._valid_expert(e, Wg.shape[0]):
        args = (e, Wg, Wu, Bg, Bu, A, b, bn, alpha, limit, BM, BN, TK, SWAP, ACT)
        if DIRECT_K > 0:
            token = b // DIRECT_K
            _gate_up_bias_block(Xs.slice(axis=0, start=token, stop=token + 1), 0, *args)
        else:
            _gate_up_bias_block(Xs, b, *args)


def _gate_up_bias_block(Xs, xb, e, Wg, Wu, Bg, Bu, A, b, bn, alpha, limit, BM, BN, TK, SWAP, ACT):
    gate = _moe._acc(BM, BN, SWAP)
    up = _moe._acc(BM, BN, SWAP)
    for k in range(ct.num_tiles(Xs, axis=1, shape=(BM, TK))):
        x = ct.load(Xs, (xb, k), (BM, TK), padding_mode=PAD_ZERO)
        gate = _moe._mma(x, _moe._weight_tile(Wg, e, bn, k, BN, TK), gate, SWAP)
        up = _moe._mma(x, _moe._weight_tile(Wu, e, bn, k, BN, TK), up, SWAP)
    gate = gate + _bias(Bg, e, bn, BN, BM, SWAP)
    up = up + _bias(Bu, e, bn, BN, BM, SWAP)
    if ACT == ACT_CLAMPED:
        gate = ct.minimum(gate, limit)
        up = ct.minimum(ct.maximum(up, -limit), limit)
        act = gate / (1.0 + ct.exp(-(gate * alpha))) * (up + 1.0)
    else:
        act = gate / (1.0 + ct.exp(-gate)) * up
    ct.store(A, (b, bn), ct.astype(_moe._acc_out(act, SWAP), A.dtype))


@ct.kernel
def tilegym_moe_down_bias_kernel(
    A, BlockExpert, Wd, Bd, Y, BM: ConstInt, BN: ConstInt, TK: ConstInt, SWAP: ConstBool
):
    """Y[block rows, bn tile] = A[block rows] @ Wd[e]^T + Bd[e]. Grid (blocks, H tiles)."""
    b = ct.bid(0)
    bn = ct.bid(1)
    e = ct.gather(BlockExpert, b)
    if _moe._valid_expert(e, Wd.shape[0]):
        acc = _moe._acc(BM, BN, SWAP)
        for k in range(ct.num_tiles(A, axis=1, shape=(BM, TK))):
            x = ct.load(A, (b, k), (BM, TK), padding_mode=PAD_ZERO)
            acc = _moe._mma(x, _moe._weight_tile(Wd, e, bn, k, BN, TK), acc, SWAP)
        acc = acc + _bias(Bd, e, bn, BN, BM, SWAP)
        ct.store(Y, (b, bn), ct.astype(_moe._acc_out(acc, SWAP), Y.dtype))


def expert_rows(
    gate_up: torch.Tensor, gate_up_bias: torch.Tensor, down: torch.Tensor, down_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """gpt-oss's expert parameters (``gate_up_proj`` ``[E, H, 2I]`` interleaved, its bias
    ``[E, 2I]``, ``down_proj`` ``[E, I, H]``, its bias ``[E, H]``) in the kernels' row layout:
    ``[E, 2I, H]`` (gate rows, then up rows), ``[E, 2I]``, ``[E, H, I]``, ``[E, H]``."""
    gu = gate_up.detach()
    rows = torch.cat((gu[..., 0::2], gu[..., 1::2]), dim=-1).transpose(1, 2).contiguous()
    gub = gate_up_bias.detach()
    bias = torch.cat((gub[..., 0::2], gub[..., 1::2]), dim=-1).contiguous()
    return rows, bias, down.detach().transpose(1, 2).contiguous(), down_bias.detach().contiguous()


def _check(hidden, gate_up, gate_up_bias, down, down_bias) -> None:
    e, i2, h = gate_up.shape
    if tuple(gate_up_bias.shape) != (e, i2) or tuple(down_bias.shape) != (e, h):
        raise ValueError(
            f"biases {tuple(gate_up_bias.shape)}/{tuple(down_bias.shape)} do not fit "
            f"gate_up {tuple(gate_up.shape)}"
        )
    for name, t in (("gate_up_bias", gate_up_bias), ("down_bias", down_bias)):
        if t.dtype != hidden.dtype or t.stride(-1) != 1 or not t.is_cuda:
            raise ValueError(f"{name} must be a CUDA tensor in the hidden dtype, unit stride")


def moe_experts_bias(
    hidden: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    gate_up_bias: torch.Tensor,
    down: torch.Tensor,
    down_bias: torch.Tensor,
    residual: torch.Tensor | None = None,
    *,
    alpha: float = 1.702,
    limit: float = 7.0,
    act: int = ACT_CLAMPED,
    out: torch.Tensor | None = None,
    config: _moe.MoeConfig | None = None,
) -> torch.Tensor:
    """``(residual +) sum_j weights[:, j] * expert_{ids[:, j]}(hidden)`` -> ``[T, H]``, the
    experts biased and gated by ``act`` (row layout: see ``expert_rows``)."""
    _moe._check_experts(hidden, ids, weights, gate_up, down, residual)
    _check(hidden, gate_up, gate_up_bias, down, down_bias)
    t, h = hidden.shape
    n_experts, i2, _ = gate_up.shape
    inter = i2 // 2
    top_k = ids.shape[1]
    if out is None:
        out = torch.empty_like(hidden, memory_format=torch.contiguous_format)
    if t == 0:
        return out
    n = t * top_k
    cfg = config or _moe.choose_config(n, n_experts)
    flat = ids.reshape(-1)
    flat = flat if flat.dtype == torch.int32 and flat.is_contiguous() else flat.int().contiguous()
    x = _moe._rows(hidden)
    consts = dict(alpha=alpha, limit=limit, act=act)
    if cfg.dispatch == "direct":
        act_rows, y = _moe._workspace(n * cfg.bm, inter, h, hidden)
        launch_gate_up_bias(x, flat, gate_up, gate_up_bias, act_rows, cfg, top_k, **consts)
        grouped_down_bias(act_rows, flat, down, down_bias, cfg, y)
        return _moe.combine(y, flat.view(t, top_k), weights, residual, out, n_experts, cfg.bm)
    sorted_, pos, bexp = _moe.moe_dispatch(flat, n_experts, cfg.bm, cfg.dispatch)
    act_rows, y = _moe._workspace(sorted_.numel(), inter, h, hidden)
    grouped_gate_up_bias(x, sorted_, bexp, gate_up, gate_up_bias, top_k, cfg, act_rows, **consts)
    grouped_down_bias(act_rows, bexp, down, down_bias, cfg, y)
    return _moe.combine(y, pos.view(t, top_k), weights, residual, out)


def grouped_gate_up_bias(
    hidden, sorted_, bexp, gate_up, gate_up_bias, top_k, cfg, act_rows, *, alpha, limit, act
) -> torch.Tensor:
    """Stage 1 on a dispatch's padded rows: the rows' hidden states gathered in block order
    (``tilegym.ops.moe``'s gather kernel), then the biased gate/up GEMM with ``act``."""
    h = hidden.shape[1]
    xs = hidden.new_empty((sorted_.numel(), h))
    th = _moe.gather_tile(h)
    args = (hidden, sorted_, bexp, xs, top_k, gate_up.shape[0], cfg.bm, th)
    grid = (bexp.numel(), math.ceil(h / th), 1)
    ct.launch(stream(hidden.device), grid, _moe.tilegym_moe_gather_rows_kernel, args)
    consts = dict(alpha=alpha, limit=limit, act=act)
    return launch_gate_up_bias(xs, bexp, gate_up, gate_up_bias, act_rows, cfg, 0, **consts)


def launch_gate_up_bias(
    xs, bexp, gate_up, gate_up_bias, act_rows, cfg, direct_k, *, alpha, limit, act
) -> torch.Tensor:
    """``act_rows[r] = act(gate_up[e] @ xs[r] + gate_up_bias[e])`` per block row; with
    ``direct_k`` > 0 (the ``direct`` dispatch) ``xs`` is the hidden states and ``bexp`` the
    router's flat ids."""
    inter = gate_up.shape[1] // 2
    gb = (gate_up_bias[:, :inter], gate_up_bias[:, inter:])
    args = (xs, bexp, gate_up[:, :inter], gate_up[:, inter:], *gb, act_rows)
    consts = (float(alpha), float(limit), cfg.bm, cfg.bn_up, cfg.tk, cfg.swap, direct_k, act)
    grid = (bexp.numel(), math.ceil(inter / cfg.bn_up), 1)
    kernel = _moe._hinted(tilegym_moe_gate_up_bias_kernel, cfg)
    ct.launch(stream(act_rows.device), grid, kernel, (*args, *consts))
    return act_rows


def grouped_down_bias(act_rows, bexp, down, down_bias, cfg, y) -> torch.Tensor:
    """Stage 2: ``y[r] = down[e] @ act_rows[r] + down_bias[e]`` for each block row."""
    args = (act_rows, bexp, down, down_bias, y, cfg.bm, cfg.bn_down, cfg.tk, cfg.swap)
    grid = (bexp.numel(), math.ceil(down.shape[1] / cfg.bn_down), 1)
    ct.launch(stream(y.device), grid, _moe._hinted(tilegym_moe_down_bias_kernel, cfg), args)
    return y


def moe_experts_bias_reference(
    hidden: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    gate_up_bias: torch.Tensor,
    down: torch.Tensor,
    down_bias: torch.Tensor,
    residual: torch.Tensor | None = None,
    *,
    alpha: float = 1.702,
    limit: float = 7.0,
    act: int = ACT_CLAMPED,
) -> torch.Tensor:
    """The same in fp32 (returned fp32) on the row layout; ids outside the experts add
    nothing."""
    x = hidden.float()
    inter = down.shape[-1]
    out = torch.zeros_like(x) if residual is None else residual.float().clone()
    ids64 = ids.to(torch.int64)
    for e in range(gate_up.shape[0]):
        tok, slot = torch.where(ids64 == e)
        if tok.numel() == 0:
            continue
        gu = x[tok] @ gate_up[e].float().T + gate_up_bias[e].float()
        g, u = gu[:, :inter], gu[:, inter:]
        if act == ACT_CLAMPED:
            g, u = g.clamp(max=limit), u.clamp(-limit, limit)
            a = g * torch.sigmoid(alpha * g) * (u + 1)
        else:
            a = torch.nn.functional.silu(g) * u
        y = a @ down[e].float().T + down_bias[e].float()
        out.index_add_(0, tok, y * weights[tok, slot].float().unsqueeze(-1))
    return out


#: gpt-oss-20b: hidden 2880, intermediate 2880, 32 experts, 4 per token
GPT_OSS_20B = dict(hidden=2880, inter=2880, experts=32, top_k=4)


def aot_signatures(
    experts: int = GPT_OSS_20B["experts"],
    top_k: int = GPT_OSS_20B["top_k"],
    hidden: int = GPT_OSS_20B["hidden"],
    tokens: tuple[int, ...] = (1, 8, 128, 256, 512, 2048),
    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,),
) -> dict:
    """``{kernel: [KernelSignature, ...]}``: the two biased GEMMs at the tiles
    ``choose_config`` picks at ``tokens`` (both activations), and the shared dispatch, gather,
    combine and router kernels at those shapes (``tilegym.ops.moe.aot_signatures``)."""
    sigs = _moe.aot_signatures(experts, top_k, hidden, tokens, dtypes)
    i32 = aligned_array_sig(ct.int32, 1)
    f32 = ScalarConstraint(ct.float32)
    cfgs = {_moe.choose_config(t * top_k, experts) for t in tokens}
    cfgs |= {replace(c, dispatch="per_slot") for c in cfgs if c.dispatch == "direct"}
    for dt in dtypes:
        a2, a3 = aligned_array_sig(_moe._CT[dt], 2), aligned_array_sig(_moe._CT[dt], 3)
        for cfg in sorted(cfgs, key=repr):
            direct = top_k if cfg.dispatch == "direct" else 0
            kernel = _moe._hinted(tilegym_moe_gate_up_bias_kernel, cfg)
            for act in (ACT_SILU, ACT_CLAMPED):
                tiles = (cfg.bm, cfg.bn_up, cfg.tk, cfg.swap, direct, act)
                sig = signature(a2, i32, a3, a3, a2, a2, a2, f32, f32, *tiles)
                if sig not in sigs.setdefault(kernel, []):
                    sigs[kernel].append(sig)
            kernel = _moe._hinted(tilegym_moe_down_bias_kernel, cfg)
            sig = signature(a2, i32, a3, a2, a2, cfg.bm, cfg.bn_down, cfg.tk, cfg.swap)
            if sig not in sigs.setdefault(kernel, []):
                sigs[kernel].append(sig)
    return sigs
