"""granite MLP activation entry point (intermediate 8192) over ``tilegym.ops.silu_and_mul``."""

from __future__ import annotations

import torch

from tilegym.ops import silu_and_mul as _ops

INTERMEDIATE = 8192


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``act_fn(gate_proj(x)) * up_proj(x)`` given the two projections."""
    return _ops.silu_and_mul(gate, up)


def aot_signatures() -> dict:
    """The kernel for the model's intermediate size (bf16)."""
    return _ops.aot_signatures(inter_sizes=(INTERMEDIATE,), dtypes=(torch.bfloat16,))
