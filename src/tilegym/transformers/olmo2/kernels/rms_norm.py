"""olmo2 RMSNorm entry point (width 2048, eps 1e-6) over ``tilegym.ops.rms_norm``.

One kernel serves every OLMo 2 norm: post_attention_layernorm, post_feedforward_layernorm, the
final norm, and the q/k norms, which span the whole projection (16 heads x 128 for q and for k).
"""

from __future__ import annotations

import torch

from tilegym.ops import rms_norm as _ops

HIDDEN = 2048
EPS = 1e-6


def rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``Olmo2RMSNorm.forward`` with the model's epsilon: ``[T, 2048]`` -> ``[T, 2048]``."""
    return _ops.rms_norm(hidden_states, weight, EPS)


def aot_signatures() -> dict:
    """The kernel this entry point launches, for the model's width (bf16)."""
    sigs = _ops.aot_signatures(hidden_sizes=(HIDDEN,), dtypes=(torch.bfloat16,))
    return {_ops.plain_kernel(): sigs[_ops.plain_kernel()]}
