"""Shared entry point of a pre-norm layer's input RMSNorm, its QKV projection and RoPE over
``tilegym.ops.gemm.rms_norm_linear_rope`` (Definitions ``[T, H]``, ``[H]``, ``[NQKV, H]``,
``[T, D]``, ``[T, D]``; axes ``HQ``, ``HK``, ``D``)."""

from __future__ import annotations

import torch

from tilegym.ops import gemm
from tilegym.ops.entry import const_axes, tensor_dtype


def rms_norm_linear_rope(
    hidden_states: torch.Tensor,
    norm_weight: torch.Tensor,
    qkv_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    eps: float,
    rotated_heads: int,
    unit_offset: bool = False,
) -> torch.Tensor:
    """``linear(RMSNorm(x), W_qkv)`` with RoPE on its first ``rotated_heads`` (q's and k's)
    heads: one launch, the rotation in the GEMV's epilogue."""
    return gemm.rms_norm_linear_rope(
        hidden_states,
        norm_weight,
        eps,
        qkv_weight,
        None,
        cos,
        sin,
        rotated_heads,
        unit_offset=unit_offset,
    )


def aot_signatures(
    definition, *, eps: float | None = None, rotated_heads: int = 0, unit_offset: bool = False
) -> dict:
    """The norm + QKV + RoPE GEMV at the Definition's head width and dtype."""
    (d,) = const_axes(definition, "D")
    return gemm.norm_rope_signatures(d, (tensor_dtype(definition),))
