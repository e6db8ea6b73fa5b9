"""gemma3 MLP activation entry point (intermediate 6912) over ``tilegym.ops.gelu_and_mul``."""

from __future__ import annotations

import torch

from tilegym.ops import gelu_and_mul as _ops

INTERMEDIATE = 6912


def gelu_tanh_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``act_fn(gate_proj(x)) * up_proj(x)`` given the two projections (``gelu_pytorch_tanh``)."""
    return _ops.gelu_tanh_and_mul(gate, up)


def aot_signatures() -> dict:
    """The kernel for the model's intermediate size (bf16)."""
    return _ops.aot_signatures(inter_sizes=(INTERMEDIATE,), dtypes=(torch.bfloat16,))
