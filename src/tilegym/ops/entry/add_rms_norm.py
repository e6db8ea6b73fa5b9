"""Shared residual add + RMSNorm entry point over ``tilegym.ops.rms_norm``."""

from __future__ import annotations

import torch

from tilegym.ops import rms_norm as _ops
from tilegym.ops.entry import const_axes, tensor_dtype


def add_rms_norm(
    hidden_states: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, *, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual + hidden_states, RMSNorm of that sum), as the decoder layer computes them."""
    return _ops.add_rms_norm(hidden_states, residual, weight, eps)


def aot_signatures(definition, *, eps: float | None = None) -> dict:
    """The fused kernel at the Definition's hidden size ``H`` and dtype."""
    (hidden,) = const_axes(definition, "H")
    sigs = _ops.aot_signatures(
        hidden_sizes=(hidden,), dtypes=(tensor_dtype(definition),), ops=("fused",)
    )
    return {_ops.fused_kernel(): sigs[_ops.fused_kernel()]}
