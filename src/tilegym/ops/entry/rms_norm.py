"""Shared RMSNorm entry point over ``tilegym.ops.rms_norm`` (Definitions ``[T, H]``, ``[H]``)."""

from __future__ import annotations

import torch

from tilegym.ops import rms_norm as _ops
from tilegym.ops.entry import const_axes, tensor_dtype


def rms_norm(
    hidden_states: torch.Tensor, weight: torch.Tensor, *, eps: float, unit_offset: bool = False
) -> torch.Tensor:
    """``<Model>RMSNorm.forward`` with the family's epsilon (``unit_offset``: Gemma's
    ``1 + weight`` form)."""
    return _ops.rms_norm(hidden_states, weight, eps, unit_offset=unit_offset)


def aot_signatures(definition, *, eps: float | None = None, unit_offset: bool = False) -> dict:
    """The plain kernel at the Definition's hidden size ``H`` and dtype."""
    (hidden,) = const_axes(definition, "H")
    sigs = _ops.aot_signatures(
        hidden_sizes=(hidden,),
        dtypes=(tensor_dtype(definition),),
        unit_offsets=(unit_offset,),
        ops=("plain",),
    )
    return {_ops.plain_kernel(): sigs[_ops.plain_kernel()]}
