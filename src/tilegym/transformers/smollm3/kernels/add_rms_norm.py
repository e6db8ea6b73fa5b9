"""smollm3 residual add + post-attention RMSNorm entry point over ``tilegym.ops.rms_norm``."""

from __future__ import annotations

import torch

from tilegym.ops import rms_norm as _ops

HIDDEN = 2048
EPS = 1e-6


def add_rms_norm(hidden_states: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor):
    """(residual + hidden_states, RMSNorm of that sum), as the decoder layer computes them."""
    return _ops.add_rms_norm(hidden_states, residual, weight, EPS)


def aot_signatures() -> dict:
    """The fused kernel for the model's hidden size (bf16)."""
    sigs = _ops.aot_signatures(hidden_sizes=(HIDDEN,), dtypes=(torch.bfloat16,))
    return {_ops.fused_kernel(): sigs[_ops.fused_kernel()]}
