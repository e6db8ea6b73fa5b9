"""granite residual add + post-attention RMSNorm entry point over ``tilegym.ops.rms_norm``.

The decoder layer adds the attention output times residual_multiplier; the fused kernel has no
scale, so the multiply is PyTorch's (as the shared layer forward does with ``linear`` off).
"""

from __future__ import annotations

import torch

from tilegym.ops import rms_norm as _ops

HIDDEN = 2048
EPS = 1e-5
RESIDUAL_MULTIPLIER = 0.22


def add_rms_norm(hidden_states: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor):
    """(residual + hidden_states * 0.22, RMSNorm of that sum), as the decoder layer has them."""
    return _ops.add_rms_norm(hidden_states * RESIDUAL_MULTIPLIER, residual, weight, EPS)


def aot_signatures() -> dict:
    """The fused kernel for the model's hidden size (bf16)."""
    sigs = _ops.aot_signatures(hidden_sizes=(HIDDEN,), dtypes=(torch.bfloat16,))
    return {_ops.fused_kernel(): sigs[_ops.fused_kernel()]}
