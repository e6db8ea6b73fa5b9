"""Shared MLP activation entry point over ``tilegym.ops.silu_and_mul``."""

from __future__ import annotations

import torch

from tilegym.ops import silu_and_mul as _ops
from tilegym.ops.entry import const_axes, tensor_dtype


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``act_fn(gate_proj(x)) * up_proj(x)`` given the two projections."""
    return _ops.silu_and_mul(gate, up)


def aot_signatures(definition) -> dict:
    """The kernel at the Definition's intermediate size ``I`` and dtype."""
    (inter,) = const_axes(definition, "I")
    return _ops.aot_signatures(inter_sizes=(inter,), dtypes=(tensor_dtype(definition),))
