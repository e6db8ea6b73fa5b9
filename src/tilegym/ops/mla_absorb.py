"""The two per-head products around the absorbed MLA decode (DeepSeek V2/V3), on cuTile.

With ``kv_b_proj``'s weight viewed as ``[H, N + V, L]`` (``W_UK = [:, :N]``, ``W_UV = [:, N:]``;
``tilegym.ops.mla.split_kv_b_weight``), one decode step around ``mla_decode`` is

- ``q_latent[b, h] = q_nope[b, h] @ W_UK[h]`` (``[N] @ [N, L]``: ``absorb_query``), and
- ``out[b, h] = ctx[b, h] @ W_UV[h]^T`` (``[L] @ [L, V]``: ``latent_to_heads``).

Both are a batched GEMV over the heads: each head's weight (128 x 512 bf16 = 128 KiB at
DeepSeek-V2-Lite's widths, 2 MiB per product and layer) is used by every sequence once. Decode
is bound by reading those weights, so one block takes one head and one tile of ``TJ`` output
columns for a tile of ``TB`` sequences and reads its weight tile once for all of them: the
weight tile is the mma's 64-row A operand (``TJ`` rows of output columns) and the sequences its
narrow N side (8 at batch <= 8), so no mma row is padding (tileiras: sm_90 tensor-core mmas of
64 x 8 x 16; 32-row weight tiles became scalar FMAs); fp32 accumulation, one rounding to the
activation dtype. The absorb's ``W_UK[h]`` is ``[N, L]`` with ``L`` contiguous: its tile is
loaded through a transposed view (``order``), the weight is never copied. Grid: (heads x column
tiles, batch tiles); DeepSeek-V2-Lite (16 heads, L 512, V 128): 128 blocks of one 128-wide step
for the absorb, 32 blocks of four steps over L for the other.
"""

from __future__ import annotations

import cuda.tile as ct
import torch

from tilegym.ops._common import PAD_ZERO, aligned_array_sig, signature, stream

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

ABSORB_TJ = 64
"""Latent columns per block of ``absorb_query`` (L 512: 8 column tiles per head)."""
HEADS_TJ = 64
"""Value columns per block of ``latent_to_heads`` (V 128: 2 column tiles per head; 32-row
weight tiles compiled to scalar FMAs, no tensor-core mma, on sm_90)."""
TILE_K = 128
"""Contraction step: the absorb's whole N (128), a quarter of the latent (512)."""
BATCH_TILES = (8, 64)
"""Sequences per block: 8 up to batch 8 (decode), else 64."""


class MlaAbsorbInputError(ValueError):
    """Inputs outside what the per-head products take."""


@ct.kernel
def mla_head_gemm_kernel(
    X,
    W,
    Y,
    TB: ConstInt,
    TJ: ConstInt,
    TK: ConstInt,
    W_ROWS_OUT: ConstBool,
):
    """``Y[b, h, j] = sum_k X[b, h, k] W'[h, k, j]`` for one (head, column tile) and ``TB``
    sequences: ``W' = W`` (``[H, K, J]``, read through a transposed view) or, with
    ``W_ROWS_OUT``, ``W^T`` (``W`` is ``[H, J, K]``, read as stored)."""
    nj = ct.cdiv(Y.shape[2], TJ)
    h = ct.bid(0) // nj
    j = ct.bid(0) % nj
    bb = ct.bid(1)
    acc = ct.full((TJ, TB), 0.0, dtype=ct.float32)
    for k in range(ct.cdiv(X.shape[2], TK)):
        if W_ROWS_OUT:
            w = ct.load(W, index=(h, j, k), shape=(1, TJ, TK), padding_mode=PAD_ZERO)
        else:
            w = ct.load(
                W, index=(h, j, k), shape=(1, TJ, TK), order=(0, 2, 1), padding_mode=PAD_ZERO
            )
        x = ct.load(X, index=(bb, h, k), shape=(TB, 1, TK), padding_mode=PAD_ZERO)
        acc = ct.mma(w.reshape((TJ, TK)), ct.transpose(x.reshape((TB, TK))), acc)
    out = ct.transpose(acc).reshape((TB, 1, TJ)).astype(Y.dtype)
    ct.store(Y, index=(bb, h, j), tile=out)


def batch_tile(b: int) -> int:
    """Sequences per block (``BATCH_TILES``): the smallest that holds ``b``, else the largest."""
    return next((tb for tb in BATCH_TILES if b <= tb), BATCH_TILES[-1])


def _check(x: torch.Tensor, w: torch.Tensor, what: str, k_axis: int) -> None:
    """One clear error; ``k_axis``: the axis of ``w`` that ``x``'s last one contracts with."""
    if x.ndim != 3 or w.ndim != 3 or x.shape[1] != w.shape[0]:
        raise MlaAbsorbInputError(
            f"{what}: x [B, H, K] and w [H, ., .] expected, got {tuple(x.shape)}, {tuple(w.shape)}"
        )
    if w.shape[k_axis] != x.shape[2]:
        raise MlaAbsorbInputError(
            f"{what}: x {tuple(x.shape)} does not fit w {tuple(w.shape)} (axis {k_axis})"
        )
    if x.dtype != w.dtype or x.dtype not in (torch.bfloat16, torch.float16):
        raise MlaAbsorbInputError(f"{what}: dtypes {x.dtype}, {w.dtype}: need one of bf16/fp16")
    if not (x.is_cuda and w.is_cuda):
        raise MlaAbsorbInputError(f"{what}: cuTile needs CUDA tensors")
    if x.stride(-1) != 1 or w.stride(-1) != 1:
        raise MlaAbsorbInputError(f"{what}: x and w need a unit last stride")


def launch_args(x, w, out, rows_out: bool) -> tuple[tuple, tuple]:
    """``(grid, args)`` of one product, nothing launched (``rows_out``: ``latent_to_heads``)."""
    b, h, _ = x.shape
    tb = batch_tile(b)
    tj = HEADS_TJ if rows_out else ABSORB_TJ
    grid = (h * -(-out.shape[2] // tj), -(-b // tb), 1)
    return grid, (x, w, out, tb, tj, TILE_K, rows_out)


def _launch(x, w, out, rows_out: bool) -> torch.Tensor:
    if x.shape[0]:
        grid, args = launch_args(x, w, out, rows_out)
        ct.launch(stream(x.device), grid, mla_head_gemm_kernel, args)
    return out


def absorb_query(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """``q_nope`` ``[B, H, N]`` through ``W_UK`` ``[H, N, L]`` (views of ``kv_b_proj``'s weight
    are taken as they are): ``q_latent`` ``[B, H, L]``."""
    _check(q_nope, w_uk, "absorb_query", 1)
    b, h, _ = q_nope.shape
    out = torch.empty((b, h, w_uk.shape[2]), dtype=q_nope.dtype, device=q_nope.device)
    return _launch(q_nope, w_uk, out, False)


def latent_to_heads(ctx: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """``ctx`` ``[B, H, L]`` through ``W_UV`` ``[H, V, L]``: per-head outputs ``[B, H, V]``
    (contiguous: ``out[:, None].reshape(B, 1, H * V)`` is o_proj's input without a copy)."""
    _check(ctx, w_uv, "latent_to_heads", 2)
    b, h, _ = ctx.shape
    out = torch.empty((b, h, w_uv.shape[1]), dtype=ctx.dtype, device=ctx.device)
    return _launch(ctx, w_uv, out, True)


def reference_absorb_query(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """``absorb_query`` in fp32 (fp64 inputs stay fp64), rounded to the input dtype."""
    dt = torch.promote_types(q_nope.dtype, torch.float32)
    out = torch.einsum("bhn,hnl->bhl", q_nope.to(dt), w_uk.to(dt))
    return out.to(q_nope.dtype)


def reference_latent_to_heads(ctx: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """``latent_to_heads`` in fp32 (fp64 inputs stay fp64), rounded to the input dtype."""
    dt = torch.promote_types(ctx.dtype, torch.float32)
    return torch.einsum("bhl,hvl->bhv", ctx.to(dt), w_uv.to(dt)).to(ctx.dtype)


def aot_signatures(dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,)) -> dict:
    """``{kernel: [KernelSignature, ...]}``: both products (the absorb's transposed weight view,
    the other's weight as stored) at every batch tile."""
    sigs = []
    for dtype in dtypes:
        a3 = aligned_array_sig(dtype, 3)
        for tb in BATCH_TILES:
            sigs.append(signature(a3, a3, a3, tb, ABSORB_TJ, TILE_K, False))
            sigs.append(signature(a3, a3, a3, tb, HEADS_TJ, TILE_K, True))
    return {mla_head_gemm_kernel: sigs}
