"""smollm3 RMSNorm entry point (hidden 2048, eps 1e-6) over ``tilegym.ops.rms_norm``."""

from __future__ import annotations

import torch

from tilegym.ops import rms_norm as _ops

HIDDEN = 2048
EPS = 1e-6


def rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``SmolLM3RMSNorm.forward`` with the model's epsilon."""
    return _ops.rms_norm(hidden_states, weight, EPS)


def aot_signatures() -> dict:
    """The kernel this entry point launches, for the model's hidden size (bf16)."""
    sigs = _ops.aot_signatures(hidden_sizes=(HIDDEN,), dtypes=(torch.bfloat16,))
    return {_ops.plain_kernel(): sigs[_ops.plain_kernel()]}
