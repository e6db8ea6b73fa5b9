"""Shared entry point of a post-norm layer's attention norm, residual add and MLP gate/up GEMM
with SiLU over ``tilegym.ops.add_norm_gate_up.add_rms_norm_gate_up`` (Definitions ``[T, H]``,
``[T, H]``, ``[H]``, ``[I2, H]``; outputs ``[T, I]`` and the sum ``[T, H]``)."""

from __future__ import annotations

import torch

from tilegym.ops import add_norm_gate_up as _ops
from tilegym.ops import gemm, rms_norm
from tilegym.ops.entry import const_axes, tensor_dtype


def add_rms_norm_gate_up_silu(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    gate_up_weight: torch.Tensor,
    *,
    eps: float,
    unit_offset: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(silu(h @ Wg^T) * (h @ Wu^T), h)`` with ``h = residual + RMSNorm(x)``: one launch at
    decode, ``rms_norm_add`` then the fused gate-up GEMM for more rows."""
    return _ops.add_rms_norm_gate_up(
        x, residual, norm_weight, eps, gate_up_weight, unit_offset=unit_offset
    )


def aot_signatures(definition, *, eps: float | None = None, unit_offset: bool = False) -> dict:
    """The one-row kernel, and for more rows the norm-add kernel at the Definition's ``H`` and
    the fused gate-up GEMM, in the Definition's dtype."""
    (hidden,) = const_axes(definition, "H")
    dtype = tensor_dtype(definition)
    return {
        **_ops.aot_signatures(dtypes=(dtype,)),
        **rms_norm.aot_signatures(
            hidden_sizes=(hidden,), dtypes=(dtype,), unit_offsets=(unit_offset,), ops=("norm_add",)
        ),
        **gemm.aot_signatures(ops=("gated",), dtypes=(dtype,)),
    }
