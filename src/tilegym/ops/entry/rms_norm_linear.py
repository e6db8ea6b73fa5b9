"""Shared entry point of a pre-norm layer's input RMSNorm and its QKV projection over
``tilegym.ops.gemm.rms_norm_linear`` (Definitions ``[T, H]``, ``[H]``, ``[NQKV, H]``)."""

from __future__ import annotations

import torch

from tilegym.ops import gemm
from tilegym.ops.entry import tensor_dtype


def rms_norm_linear(
    hidden_states: torch.Tensor,
    norm_weight: torch.Tensor,
    qkv_weight: torch.Tensor,
    *,
    eps: float,
    unit_offset: bool = False,
) -> torch.Tensor:
    """``linear(RMSNorm(x), W_qkv)``: one launch at decode (the norm in the GEMV's K loop), the
    norm kernel then the GEMM for more rows."""
    return gemm.rms_norm_linear(
        hidden_states, norm_weight, eps, qkv_weight, unit_offset=unit_offset
    )


def aot_signatures(definition, *, eps: float | None = None, unit_offset: bool = False) -> dict:
    """The norm-prologue GEMV and, for many rows, the plain GEMM, in the Definition's dtype."""
    dtypes = (tensor_dtype(definition),)
    return {
        **gemm.aot_signatures(ops=("norm",), dtypes=dtypes),
        **gemm.aot_signatures(ops=("linear",), dtypes=dtypes),
    }
