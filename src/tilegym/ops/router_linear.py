"""A MoE router's fp32 linear from bf16/fp16 operands, and DeepSeek-V2's greedy routing fused
after it, on cuTile.

DeepSeek's routers compute ``F.linear(x.float(), weight.float())``: fp32 logits of the upcast
activations and weight. bf16 and fp16 values are exact in fp32 and so are their products, so an
mma of the bf16/fp16 tiles accumulating in fp32 computes the same logits up to the order of the
fp32 sums, with no upcast copy of the weight or the activations per call (PyTorch on the H200:
two conversion kernels plus an fp32 cuBLAS GEMV or SIMT sgemm per MoE layer and step).

Two launches: a split-K GEMM over (token tile x expert tile, K share) blocks writes fp32
partial logits ``[splits, T, EP]`` (written and read without TMA, as ``gemm``'s split-K
partials); the expert tile (all 64 of DeepSeek-V2-Lite's experts) is the mma's M side and the
tokens its N side, so at decode (8 token columns) no mma row is padding, and the K splits
spread the weight (256 KiB) over 16 blocks. The second launch, a
programmatic dependent of the first, sums a token tile's partials in a fixed order and either
stores the logits (``router_logits``: V2's group-limited and V3's routers route them in
PyTorch) or routes them (``router_greedy``, DeepSeek-V2's greedy ``DeepseekV2TopkRouter``):
softmax over the experts in fp32, the ``top_k`` largest best first, times the routed scaling
factor, no renormalization. The k experts are taken by their logits (the softmax is monotone,
so they are the k largest scores; upstream's ``torch.topk(sorted=False)`` leaves ties open,
here they go to the lower expert), so a score that underflows to 0 cannot reorder them.
"""

from __future__ import annotations

import math

import cuda.tile as ct
import torch

from tilegym.ops._common import (
    PAD_ZERO,
    aligned_array_sig,
    next_pow2,
    signature,
    sm_count,
    stream,
    take_max,
)

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

TILE_K = 128
"""Hidden columns per K step (DeepSeek-V2-Lite's 2048: 16 steps, one per split at decode)."""
TOKEN_TILES = (8, 64)
"""Tokens per GEMM block (the mma's N side): 8 up to 8 tokens (decode), else 64."""
MAX_EXPERT_TILE = 128
"""Experts per GEMM block at most (the mma's M side; more experts take more blocks)."""
MAX_SPLITS = 32
ROUTE_ELEMS = 2048
"""Logits per block of the second launch (tokens x experts rounded up to a power of two)."""


class RouterInputError(ValueError):
    """Inputs the router kernels do not take."""


@ct.kernel
def router_logits_partial_kernel(
    X, W, WS, k_per_split: int, TM: ConstInt, TE: ConstInt, TK: ConstInt
):
    """``WS[s, tokens, experts]`` = the fp32 products of one (token tile, expert tile) summed over
    split ``s``'s share of the hidden dim: ``W`` tile (experts x K) times ``X`` tile^T."""
    ne = ct.cdiv(WS.shape[2], TE)
    bm = ct.bid(0) // ne
    be = ct.bid(0) % ne
    s = ct.bid(1)
    k0 = s * k_per_split
    k1 = ct.minimum(k0 + k_per_split, ct.cdiv(X.shape[1], TK))
    acc = ct.full((TE, TM), 0.0, dtype=ct.float32)
    for k in range(k0, k1):
        w = ct.load(W, index=(be, k), shape=(TE, TK), padding_mode=PAD_ZERO)
        x = ct.load(X, index=(bm, k), shape=(TM, TK), padding_mode=PAD_ZERO)
        acc = ct.mma(w, ct.transpose(x), acc)
    tile = ct.transpose(acc).reshape((1, TM, TE))
    ct.store(WS, index=(s, bm, be), tile=tile, allow_tma=False)


@ct.kernel
def router_logits_route_kernel(
    WS,
    Logits,
    Weights,
    Ids,
    splits: int,
    n_experts: int,
    scaling: float,
    TM: ConstInt,
    EP: ConstInt,
    TOP_K: ConstInt,
    KP: ConstInt,
    ROUTE: ConstBool,
):
    """Sum the ``splits`` partials of ``TM`` tokens in order; store the fp32 logits or, with
    ``ROUTE``, the ``TOP_K`` best experts' softmax weights times ``scaling`` and their ids (best
    first, ties to the lower expert). Launched as a programmatic dependent of the GEMM."""
    bt = ct.bid(0)
    ct.grid_dependency_control_wait()
    x = ct.full((TM, EP), 0.0, dtype=ct.float32)
    for s in range(splits):
        part = ct.load(
            WS, index=(s, bt, 0), shape=(1, TM, EP), padding_mode=PAD_ZERO, allow_tma=False
        )
        x = x + part.reshape((TM, EP))
    if ROUTE:
        cols = ct.broadcast_to(ct.arange(EP, dtype=ct.int32).reshape((1, EP)), (TM, EP))
        x = ct.where(cols < n_experts, x, -math.inf)
        top = ct.max(x, axis=1, keepdims=True)
        denom = ct.sum(ct.exp(x - top), axis=1, keepdims=True)
        slot = ct.broadcast_to(ct.arange(KP, dtype=ct.int32).reshape((1, KP)), (TM, KP))
        vals = ct.broadcast_to(top, (TM, KP))
        idx = ct.full((TM, KP), 0, dtype=ct.int32)
        for j in range(TOP_K):
            x, vals, idx = take_max(x, cols, slot, j, vals, idx, -math.inf)
        weights = ct.exp(vals - top) / denom * scaling
        ct.store(Weights, index=(bt, 0), tile=weights)
        ct.store(Ids, index=(bt, 0), tile=idx)
    else:
        ct.store(Logits, index=(bt, 0), tile=x)


def token_tile(t: int) -> int:
    """Tokens per GEMM block (``TOKEN_TILES``): the smallest that holds ``t``, else the largest."""
    return next((tm for tm in TOKEN_TILES if t <= tm), TOKEN_TILES[-1])


def expert_tiles(n_experts: int) -> tuple[int, int]:
    """(EP, TE): the experts rounded up to a power of two, at least 64 (the rows past the
    experts load as zeros, no memory traffic: a 32-row weight tile compiled to scalar FMAs, a
    64-row one to tensor-core mmas), and the experts per GEMM block."""
    ep = max(64, next_pow2(n_experts))
    return ep, min(ep, MAX_EXPERT_TILE)


def route_rows(t: int, ep: int) -> int:
    """Tokens per block of the second launch: 8 at decode (t <= 8), else ``ROUTE_ELEMS // ep``
    (two builds per expert count)."""
    return max(1, min(8 if t <= 8 else ROUTE_ELEMS, ROUTE_ELEMS // ep))


def plan_splits(m_blocks: int, k_tiles: int, num_sms: int) -> tuple[int, int]:
    """``(splits, K tiles per split)``: about one block per SM, every split non-empty."""
    want = max(1, min(k_tiles, MAX_SPLITS, num_sms // max(1, m_blocks)))
    per = -(-k_tiles // want)
    return -(-k_tiles // per), per


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.ndim != 2 or weight.ndim != 2 or x.shape[1] != weight.shape[1]:
        raise RouterInputError(
            f"x [T, H] and weight [E, H] expected, got {tuple(x.shape)}, {tuple(weight.shape)}"
        )
    if x.dtype != weight.dtype or x.dtype not in (torch.bfloat16, torch.float16):
        raise RouterInputError(
            f"x {x.dtype} and weight {weight.dtype}: need one of bf16/fp16 for both"
        )
    if not (x.is_cuda and weight.is_cuda):
        raise RouterInputError("the cuTile router needs CUDA tensors")
    if weight.shape[0] > ROUTE_ELEMS:
        raise RouterInputError(f"{weight.shape[0]} experts: at most {ROUTE_ELEMS}")


def launches(x, weight, route: tuple[int, float] | None, num_sms: int):
    """``(result, [(kernel, grid, args, dependent), ...])`` of one call, nothing launched:
    ``route`` is ``(top_k, scaling)`` (result: weights and ids) or None (result: the logits);
    the outputs and the workspace are allocated on ``x``'s device."""
    t, hidden = x.shape
    e = weight.shape[0]
    dev = x.device
    top_k = route[0] if route else 1
    logits = torch.empty((t, e) if not route else (1, 1), dtype=torch.float32, device=dev)
    weights = torch.empty((t, top_k) if route else (1, 1), dtype=torch.float32, device=dev)
    ids = torch.empty((t, top_k) if route else (1, 1), dtype=torch.int32, device=dev)
    result = (weights, ids) if route else logits
    if t == 0:
        return result, []
    tm = token_tile(t)
    ep, te = expert_tiles(e)
    m_blocks = -(-t // tm) * (ep // te)
    splits, per = plan_splits(m_blocks, -(-hidden // TILE_K), num_sms)
    ws = torch.empty((splits, t, ep), dtype=torch.float32, device=dev)
    rows = route_rows(t, ep)
    scaling = float(route[1]) if route else 1.0
    reduce = (ws, logits, weights, ids, splits, e, scaling, rows, ep, top_k, next_pow2(top_k))
    return result, [
        (
            router_logits_partial_kernel,
            (m_blocks, splits, 1),
            (x, weight, ws, per, tm, te, TILE_K),
            False,
        ),
        (router_logits_route_kernel, (-(-t // rows), 1, 1), (*reduce, route is not None), True),
    ]


def _run(x, weight, route: tuple[int, float] | None):
    _check(x, weight)
    if route and not 1 <= route[0] <= weight.shape[0]:
        raise RouterInputError(f"top_k={route[0]} outside [1, {weight.shape[0]}]")
    if x.stride(-1) != 1 or (x.shape[0] > 1 and x.stride(0) != x.shape[1]):
        x = x.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    result, todo = launches(x, weight, route, sm_count(x.device))
    launch_stream = stream(x.device)
    for kernel, grid, args, dependent in todo:
        ct.launch(launch_stream, grid, kernel, args, programmatic_dependent_launch=dependent)
    return result


def router_logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """fp32 ``x [T, H] @ weight [E, H]^T`` of bf16/fp16 operands: ``[T, E]``."""
    return _run(x, weight, None)


def router_greedy(
    x: torch.Tensor, weight: torch.Tensor, top_k: int, scaling: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights ``[T, top_k]`` fp32, ids ``[T, top_k]`` int32) of the softmax of the fp32
    logits: the ``top_k`` largest best first, times ``scaling`` (DeepSeek-V2's greedy router)."""
    return _run(x, weight, (int(top_k), float(scaling)))


def reference_router_logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Upstream's ``F.linear(x.float(), weight.float())`` (fp64 inputs stay fp64)."""
    dt = torch.promote_types(x.dtype, torch.float32)
    return torch.nn.functional.linear(x.to(dt), weight.to(dt))


def reference_router_greedy(
    x: torch.Tensor, weight: torch.Tensor, top_k: int, scaling: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``router_greedy`` in PyTorch: the experts by a stable sort of the logits (ties to the
    lower expert), their softmax scores times ``scaling``; fp32 weights, int32 ids."""
    logits = reference_router_logits(x, weight)
    ids = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :top_k]
    scores = logits.softmax(dim=-1)
    weights = scores.gather(1, ids) * scaling
    return weights.to(torch.float32), ids.to(torch.int32)


def _plain(dtype, ndim: int):
    """Unit last stride, any other stride (the outputs: ``[T, k]`` weights and ids, k = 6 no
    multiple of 16 bytes, ``[T, E]`` logits, and the one-element placeholders)."""
    from tilegym.ops.attention import array_constraint

    return array_constraint(dtype, ndim)


def aot_signatures(
    n_experts: int = 64,
    top_k: int = 6,
    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,),
    tokens: tuple[int, ...] = (1, 2048),
) -> dict:
    """``{kernel: [KernelSignature, ...]}`` at ``n_experts`` (DeepSeek-V2-Lite: 64, 6 per
    token): the GEMM at each token tile ``tokens`` pick, the second launch routing (``top_k``)
    and storing logits, at each row count those token counts pick."""
    from cuda.tile.compilation import ScalarConstraint

    i32, f32 = ScalarConstraint(ct.int32), ScalarConstraint(ct.float32)
    ep, te = expert_tiles(n_experts)
    ws = aligned_array_sig(ct.float32, 3)
    gemm = []
    for dtype in dtypes:
        a2 = aligned_array_sig(dtype, 2)
        for tm in sorted({token_tile(t) for t in tokens}):
            gemm.append(signature(a2, a2, ws, i32, tm, te, TILE_K))
    route = []
    io = (ws, _plain(ct.float32, 2), _plain(ct.float32, 2), _plain(ct.int32, 2), i32, i32, f32)
    for rows in sorted({route_rows(t, ep) for t in tokens}):
        for flag, k in ((True, top_k), (False, 1)):  # the logits launch passes k = 1
            sig = signature(*io, rows, ep, k, next_pow2(k), flag)
            if sig not in route:
                route.append(sig)
    return {router_logits_partial_kernel: gemm, router_logits_route_kernel: route}
