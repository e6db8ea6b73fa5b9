"""RoPE tables in the half-split layout, ``cos(pos * inv_freq) * scaling`` in both halves, on
cuTile: the rotary module of every Llama-form family (``tilegym.transformers.rope_tables``) and
DeepSeek-V2's complex table split into halves (``tilegym.transformers.mla``).

Llama's rotary module computes ``f = pos * inv_freq`` in fp32, ``cat(f, f)``, cosine and sine
times ``attention_scaling``, cast to the activation dtype; ``DeepseekV2RotaryEmbedding`` returns
``polar(1, f) * attention_scaling`` as a complex ``[B, S, R/2]`` table, which the patched MLA
rotates by halves on permuted projection rows (``cos = cat(c, c)``, ``sin = cat(s, s)``, ``c``,
``s``: its real and imaginary parts). In PyTorch that is the rotary module's kernels per step
(the frequencies, the cosine and sine or ``polar``, the scaling, the cast) and, for V2, per
layer the table's split, concatenation and cast. This computes both tables once per step from
the positions in one launch: ``f = float(pos) * inv_freq`` in fp32 as upstream does (the same
rounded products), ``f`` reduced to about ``[-pi, pi]`` by a two-constant Cody-Waite step
(``2 pi = C1 + C2``, ``C1`` with 8 significant bits so ``k * C1`` is exact for ``k < 2^16``, about
400 000 positions; error below 1e-5 rad), then cosine and sine, the scaling, one rounding to
the table's dtype.
"""

from __future__ import annotations

import math

import cuda.tile as ct
import torch

from tilegym.ops._common import PAD_ZERO, ct_dtype, signature, stream
from tilegym.ops.attention import array_constraint

ConstInt = ct.Constant[int]

TWO_PI_HI = 6.28125
"""2 pi's leading 8 significant bits: ``k * TWO_PI_HI`` is exact in fp32 for ``k < 2^16``."""
TWO_PI_LO = 2.0 * math.pi - TWO_PI_HI
INV_TWO_PI = 1.0 / (2.0 * math.pi)
TOKEN_TILES = (8, 64)
"""Tokens per block: 8 up to 8 tokens (decode), else 64."""


class RotaryTablesInputError(ValueError):
    """Inputs the table kernel does not take."""


@ct.kernel
def rotary_tables_kernel(Pos, InvFreq, Cos, Sin, scaling: float, TS: ConstInt, RH: ConstInt):
    """``Cos``/``Sin`` ``[tokens, 2 RH]`` of ``TS`` tokens: ``cos(f) * scaling`` (and sine) in
    both halves, ``f = float(Pos[t]) * InvFreq``."""
    t = ct.bid(0)
    pos = ct.load(Pos, index=(t,), shape=(TS,), padding_mode=PAD_ZERO).astype(ct.float32)
    inv = ct.load(InvFreq, index=(0,), shape=(RH,), padding_mode=PAD_ZERO).astype(ct.float32)
    f = pos.reshape((TS, 1)) * inv.reshape((1, RH))
    k = ct.floor(f * INV_TWO_PI + 0.5)
    r = (f - k * TWO_PI_HI) - k * TWO_PI_LO
    c = (ct.cos(r) * scaling).astype(Cos.dtype)
    s = (ct.sin(r) * scaling).astype(Sin.dtype)
    ct.store(Cos.slice(1, 0, RH), index=(t, 0), tile=c)
    ct.store(Cos.slice(1, RH, 2 * RH), index=(t, 0), tile=c)
    ct.store(Sin.slice(1, 0, RH), index=(t, 0), tile=s)
    ct.store(Sin.slice(1, RH, 2 * RH), index=(t, 0), tile=s)


def token_tile(n: int) -> int:
    """Tokens per block (``TOKEN_TILES``): the smallest that holds ``n``, else the largest."""
    return next((ts for ts in TOKEN_TILES if n <= ts), TOKEN_TILES[-1])


def _check(position_ids: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> None:
    if position_ids.ndim != 2 or position_ids.dtype not in (torch.int64, torch.int32):
        raise RotaryTablesInputError(
            f"position_ids must be int64/int32 [B, S], got {position_ids.dtype} "
            f"{tuple(position_ids.shape)}"
        )
    rh = inv_freq.shape[0] if inv_freq.ndim == 1 else 0
    if rh < 8 or rh & (rh - 1) or not inv_freq.is_floating_point():
        raise RotaryTablesInputError(
            f"inv_freq must be a float [R/2] with R/2 a power of two >= 8, got {inv_freq.dtype} "
            f"{tuple(inv_freq.shape)}"
        )
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise RotaryTablesInputError(f"table dtype {dtype} is not one of bf16/fp16/fp32")
    if not (position_ids.is_cuda and inv_freq.is_cuda):
        raise RotaryTablesInputError("the cuTile tables need CUDA tensors")


def launch_args(pos, inv_freq, cos, sin, scaling: float) -> tuple[tuple, tuple]:
    """``(grid, args)`` of one call on flattened positions ``[N]`` and tables ``[N, R]``."""
    ts = token_tile(pos.shape[0])
    args = (pos, inv_freq, cos, sin, float(scaling), ts, inv_freq.shape[0])
    return (-(-pos.shape[0] // ts), 1, 1), args


def rotary_tables(
    position_ids: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` ``[B, S, R]`` in ``dtype``: ``cat(c, c)`` and ``cat(s, s)`` of the complex
    table ``polar(1, pos * inv_freq) * scaling`` (``R = 2 * len(inv_freq)``)."""
    _check(position_ids, inv_freq, dtype)
    b, s = position_ids.shape
    rot = 2 * inv_freq.shape[0]
    cos = torch.empty((b, s, rot), dtype=dtype, device=position_ids.device)
    sin = torch.empty_like(cos)
    if b * s:
        pos = position_ids.reshape(-1)
        if pos.stride(0) != 1:
            pos = pos.contiguous()
        grid, args = launch_args(pos, inv_freq, cos.view(b * s, rot), sin.view(b * s, rot), scaling)
        ct.launch(stream(position_ids.device), grid, rotary_tables_kernel, args)
    return cos, sin


def reference_rotary_tables(
    position_ids: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama's table (``LlamaRotaryEmbedding.forward``, the same values as transformers 5.17's
    ``inv_freq @ position_ids`` form: one product per angle): ``cat(f, f).cos() * scaling`` and
    the sine, cast. DeepSeek-V2's ``polar(1, f) * scaling`` split and repeated is the same table
    up to fp32 rounding of ``polar``'s parts (``tests/ops/test_rotary_tables.py``)."""
    freqs = position_ids[..., None].float() * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


def aot_signatures(
    rope_dim: int = 64,
    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,),
    freq_dtypes: tuple[torch.dtype, ...] = (torch.float32,),
) -> dict:
    """``{kernel: [KernelSignature, ...]}`` at ``rope_dim`` (DeepSeek-V2-Lite: 64): int64
    positions, ``inv_freq`` in each of ``freq_dtypes``, tables in each of ``dtypes``, both token
    tiles."""
    from cuda.tile.compilation import ScalarConstraint

    sigs = []
    for dtype in dtypes:
        table = array_constraint(ct_dtype(dtype), 2)
        for freq in freq_dtypes:
            head = (array_constraint(ct.int64, 1), array_constraint(ct_dtype(freq), 1))
            for ts in TOKEN_TILES:
                sigs.append(
                    signature(*head, table, table, ScalarConstraint(ct.float32), ts, rope_dim // 2)
                )
    return {rotary_tables_kernel: sigs}
