"""Shared entry point of the gated RMSNorm (``norm(x) * weight * silu(z)`` per head of a gated
delta net layer: Qwen3.5, Qwen3-Next) over ``tilegym.ops.rms_norm_gated``."""

from __future__ import annotations

import torch

from tilegym.ops import rms_norm_gated as _ops
from tilegym.ops.entry import const_axes, tensor_dtype


def rms_norm_gated(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, *, eps: float):
    """``XRMSNormGated.forward(x, gate=z)`` over rows of the head width ``N``."""
    return _ops.rms_norm_gated(x, z, weight, eps)


def aot_signatures(definition, *, eps: float | None = None) -> dict:
    """The kernel at the Definition's row width ``N`` and dtype."""
    (width,) = const_axes(definition, "N")
    return _ops.aot_signatures(row_sizes=(width,), dtypes=(tensor_dtype(definition),))
