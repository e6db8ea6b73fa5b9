"""Shared entry point of a pre-norm layer's post-attention RMSNorm and its MLP's gate/up GEMM
with SiLU over ``tilegym.ops.gemm.rms_norm_gate_up`` (Definitions ``[T, H]``, ``[H]``,
``[I2, H]``)."""

from __future__ import annotations

import torch

from tilegym.ops import gemm
from tilegym.ops.entry import tensor_dtype


def rms_norm_gate_up_silu(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    gate_up_weight: torch.Tensor,
    *,
    eps: float,
    unit_offset: bool = False,
) -> torch.Tensor:
    """``silu(RMSNorm(x) @ Wg^T) * (RMSNorm(x) @ Wu^T)``: one launch at decode (the norm in
    the GEMV's K loop), the norm kernel then the fused gate-up GEMM for more rows."""
    return gemm.rms_norm_gate_up(x, norm_weight, eps, gate_up_weight, unit_offset=unit_offset)


def aot_signatures(definition, *, eps: float | None = None, unit_offset: bool = False) -> dict:
    """The norm-prologue gate/up GEMV and, for many rows, the fused gate-up GEMM, in the
    Definition's dtype."""
    dtypes = (tensor_dtype(definition),)
    return {
        **gemm.aot_signatures(ops=("norm_gated",), dtypes=dtypes),
        **gemm.aot_signatures(ops=("gated",), dtypes=dtypes),
    }
