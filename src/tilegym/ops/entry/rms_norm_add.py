"""Shared entry point of a post-norm sub-block's norm and residual add over
``tilegym.ops.rms_norm.rms_norm_add`` (Definitions ``[T, H]``, ``[T, H]``, ``[H]``): OLMo 2 and
OLMo 3 normalize each sub-block's output, then add it to the residual."""

from __future__ import annotations

import torch

from tilegym.ops import rms_norm as _ops
from tilegym.ops.entry import const_axes, tensor_dtype


def rms_norm_add(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float,
    unit_offset: bool = False,
) -> torch.Tensor:
    """``residual + RMSNorm(x)``, the norm rounded to x's dtype before the add."""
    return _ops.rms_norm_add(x, residual, weight, eps, unit_offset=unit_offset)[0]


def aot_signatures(definition, *, eps: float | None = None, unit_offset: bool = False) -> dict:
    """The norm-add kernel at the Definition's hidden size ``H`` and dtype (without and with
    the next norm, as the module declares them)."""
    (hidden,) = const_axes(definition, "H")
    return _ops.aot_signatures(
        hidden_sizes=(hidden,),
        dtypes=(tensor_dtype(definition),),
        unit_offsets=(unit_offset,),
        ops=("norm_add",),
    )
