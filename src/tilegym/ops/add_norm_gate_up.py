"""A post-norm layer's attention norm, residual add and MLP gate/up GEMV in one decode launch.

OLMo 2/3 add a normed sub-block output to the residual, ``h = r + RMSNorm(o)``, and the MLP
reads ``h``. At decode that was the ``rms_norm_add`` launch (2.8 µs a layer at olmo3's shape on
the H200), then the gate/up GEMV. Here the GEMV forms ``h`` itself: ``h @ W^T = r @ W^T + inv
* ((o * w) @ W^T)`` with ``inv = rsqrt(mean(o^2) + eps)``, so each block's K loop reads r and o
(and the norm weight), keeps the two products apart and sums the squares of o, and the row's
``inv`` joins them once at the end, as `gemm.rms_norm_linear` does for a pre-norm. The GEMV
sees ``h`` unrounded (closer to fp32 than the module's bf16 ``h``). The first block of each row
also writes ``h`` as ``rms_norm_add`` rounds it (the norm rounded to the activations' dtype,
then the add as PyTorch's): it is the residual the layer's second add needs.
"""

from __future__ import annotations

import cuda.tile as ct
import torch

from tilegym.ops import gemm as _gemm
from tilegym.ops import rms_norm as _rms_norm
from tilegym.ops.gelu_and_mul import gelu_tanh_and_mul_reference
from tilegym.ops.gemm import (
    ACT_SILU,
    _act_mul_store,
    _gemv_normed_x,
    _gemv_scaled,
    _gemv_tiles,
    _gemv_w,
    _gemv_x,
)
from tilegym.ops.gemm_configs import TileConfig
from tilegym.ops.silu_and_mul import silu_and_mul_reference

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
_ZERO = ct.PaddingMode.ZERO

#: one row, two output rows of each weight a block, 1024 of K a step, hinted to 8 blocks an SM
#: as the norm + QKV + RoPE GEMV is. sm_90 ptxas: 64 registers; the PDL form (the one a decode
#: step runs once the weight is ready) has no spills, the plain one spills 52 bytes. 512 of K
#: fitted both without spills but took 97.8 us a call at olmo3's gate/up on an H100 (12-07),
#: where the table's mma kernel takes about 64
TILE = TileConfig(1, 2, 1024, gemv=True, occupancy=8)


@ct.function
def _store_sum(R, X, NW, H, bm, inv, TM: ConstInt, TK: ConstInt, OFFSET: ConstBool):
    """Row tile ``bm`` of ``H = R + RMSNorm(X)``, rounded as ``rms_norm_add_kernel`` rounds it:
    Llama's normed row rounded to X's dtype, then times the weight (OFFSET: times ``1 +
    weight`` in fp32), rounded; the add in fp32, rounded."""
    for k in range(ct.num_tiles(X, axis=1, shape=(TM, TK))):
        x = _gemv_x(X, bm, k, TM, TK)
        r = _gemv_x(R, bm, k, TM, TK)
        w = ct.load(NW, (k,), (TK,), padding_mode=_ZERO, allow_tma=False).astype(ct.float32)
        w = w.reshape((1, TK))
        if OFFSET:
            normed = (x * inv * (w + 1.0)).astype(H.dtype).astype(ct.float32)
        else:
            normed = (x * inv).astype(X.dtype).astype(ct.float32)
            normed = (normed * w).astype(H.dtype).astype(ct.float32)
        ct.store(H, index=(bm, k), tile=(r + normed).astype(H.dtype), allow_tma=False)


@ct.kernel
def tilegym_add_norm_gate_up_gemv_kernel(
    R,
    X,
    NW,
    WG,
    WU,
    Y,
    H,
    eps: float,
    TM: ConstInt,
    TN: ConstInt,
    TK: ConstInt,
    LATENCY: ConstInt,
    OFFSET: ConstBool,
    ACT: ConstInt,
    PDL: ConstBool,
):
    """Y = act(H @ WG^T) * (H @ WU^T) with H = R + RMSNorm(X) (norm weight NW), for a few rows;
    the blocks of N tile 0 also store H. Both weights' first tiles are loaded before the PDL
    wait, R, X and NW after it (the previous kernels write R and X)."""
    bn = ct.bid(0)
    bm = ct.bid(1)
    wg = _gemv_w(WG, bn, 0, TN, TK, LATENCY)
    wu = _gemv_w(WU, bn, 0, TN, TK, LATENCY)
    if PDL:
        ct.grid_dependency_control_wait()
    r = _gemv_x(R, bm, 0, TM, TK)
    x, xw = _gemv_normed_x(X, NW, bm, 0, TM, TK, OFFSET)
    sq = x * x
    gate_r = ct.sum(_gemv_scaled(r, wg, TM, TN, TK), axis=2)
    gate_x = ct.sum(_gemv_scaled(xw, wg, TM, TN, TK), axis=2)
    up_r = ct.sum(_gemv_scaled(r, wu, TM, TN, TK), axis=2)
    up_x = ct.sum(_gemv_scaled(xw, wu, TM, TN, TK), axis=2)
    for k in range(1, ct.num_tiles(WG, axis=1, shape=(TN, TK))):
        wg = _gemv_w(WG, bn, k, TN, TK, LATENCY)
        wu = _gemv_w(WU, bn, k, TN, TK, LATENCY)
        r = _gemv_x(R, bm, k, TM, TK)
        x, xw = _gemv_normed_x(X, NW, bm, k, TM, TK, OFFSET)
        sq = sq + x * x
        gate_r = gate_r + ct.sum(_gemv_scaled(r, wg, TM, TN, TK), axis=2)
        gate_x = gate_x + ct.sum(_gemv_scaled(xw, wg, TM, TN, TK), axis=2)
        up_r = up_r + ct.sum(_gemv_scaled(r, wu, TM, TN, TK), axis=2)
        up_x = up_x + ct.sum(_gemv_scaled(xw, wu, TM, TN, TK), axis=2)
    inv = ct.rsqrt(ct.sum(sq, axis=1, keepdims=True) / X.shape[1] + eps)
    _act_mul_store(gate_r + gate_x * inv, up_r + up_x * inv, Y, bm, bn, ACT)
    if bn == 0:
        _store_sum(R, X, NW, H, bm, inv, TM, TK, OFFSET)


def _launch(x2, r2, norm_weight, eps, gate_up_weight, out2, h2, act, offset, cfg) -> None:
    i = gate_up_weight.shape[0] // 2
    pdl = _gemm.GEMV_PDL and _gemm._pdl_ready(gate_up_weight)
    wg, wu = gate_up_weight[:i], gate_up_weight[i:]
    args = (r2, x2, norm_weight, wg, wu, out2, h2, float(eps), *_gemv_tiles(cfg))
    args += (bool(offset), act, pdl)
    _gemm._launch_rows(tilegym_add_norm_gate_up_gemv_kernel, cfg, x2, i, args, pdl)


def add_rms_norm_gate_up(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    gate_up_weight: torch.Tensor,
    *,
    act: int = ACT_SILU,
    unit_offset: bool = False,
    config: TileConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(act(h @ Wg^T) * (h @ Wu^T), h)`` with ``h = residual + RMSNorm(x)`` and
    ``gate_up_weight = cat([Wg, Wu])``: a post-norm layer's attention norm, residual add and
    MLP gate/up. One row is one launch of `tilegym_add_norm_gate_up_gemv_kernel` (at `TILE`, or
    ``config``, a one-row GEMV tile: the benchmark's); more rows (or a norm weight in another
    dtype) take ``rms_norm_add``, then the gate/up GEMM."""
    cfg = config or TILE
    if not cfg.gemv or cfg.tm != 1:
        raise ValueError(f"add_rms_norm_gate_up: {cfg} is not a one-row GEMV tile")
    k = x.shape[-1]
    _gemm._check(x, gate_up_weight, k)
    if gate_up_weight.shape[0] % 2 or gate_up_weight.shape[0] // 2 % cfg.tn:
        raise ValueError(
            f"gate_up_weight's {gate_up_weight.shape[0]} rows are not two halves of "
            f"{cfg.tn}-row tiles"
        )
    if residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device:
        raise ValueError(
            f"residual {residual.dtype} {tuple(residual.shape)} must be x's "
            f"{x.dtype} {tuple(x.shape)} on {x.device}"
        )
    norm_weight = _gemm._norm_weight(norm_weight, k)
    x2, r2 = _gemm._as_2d(x), _gemm._as_2d(residual)
    m = x2.shape[0]
    if m != 1 or norm_weight.dtype != x.dtype:
        h = _rms_norm.rms_norm_add(x, residual, norm_weight, eps, unit_offset=unit_offset)[0]
        return _gemm._fused_gate_up(h, gate_up_weight, act, None, None), h
    i = gate_up_weight.shape[0] // 2
    out = torch.empty(*x.shape[:-1], i, dtype=x.dtype, device=x.device)
    h = torch.empty_like(x)
    args = (x2, r2, norm_weight, eps, gate_up_weight, out.view(m, i), h.view(m, k))
    _launch(*args, act, unit_offset, cfg)
    return out, h


def add_rms_norm_gate_up_reference(
    x, residual, norm_weight, eps, gate_up_weight, gelu_tanh=False, unit_offset=False
):
    """``rms_norm_add``'s sum, then the gate/up projection and SiLU (GELU-tanh) times up, as
    the post-norm layer and its MLP compute them."""
    h = _rms_norm.rms_norm_add_reference(x, residual, norm_weight, eps, None, unit_offset)[0]
    gate_up = torch.nn.functional.linear(h, gate_up_weight)
    act_and_mul = gelu_tanh_and_mul_reference if gelu_tanh else silu_and_mul_reference
    return act_and_mul(gate_up).contiguous(), h.contiguous()


def aot_signatures(dtypes=(torch.bfloat16,), acts=(ACT_SILU,)) -> dict:
    """The kernel at `TILE`, with and without PDL, 16-byte aligned arrays (what a model
    passes), the plain (Llama) norm weight."""
    from cuda.tile.compilation import CallingConvention, KernelSignature, ScalarConstraint

    from tilegym.ops.attention import array_constraint as arr

    ct_dtypes = {torch.bfloat16: ct.bfloat16, torch.float16: ct.float16}
    kernel = _gemm.hinted(tilegym_add_norm_gate_up_gemv_kernel, TILE, 1)
    cconv = CallingConvention.cutile_python_v1()
    sigs = []
    for torch_dt in dtypes:
        dt = ct_dtypes[torch_dt]
        io = [arr(dt, 2), arr(dt, 2), arr(dt, 1), arr(dt, 2), arr(dt, 2), arr(dt, 2), arr(dt, 2)]
        consts = [ScalarConstraint(ct.float32), *_gemv_tiles(TILE), False]
        for act in acts:
            for pdl in (False, True):
                sigs.append(KernelSignature([*io, *consts, act, pdl], cconv))
    return {kernel: sigs}
