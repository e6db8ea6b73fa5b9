"""gemma3 RMSNorm entry point (hidden 1152, eps 1e-6) over ``tilegym.ops.rms_norm``.

``Gemma3RMSNorm``: fp32, scaled by ``1 + weight``, rounded once (``unit_offset``). The layers'
input norms and the final norm launch it.
"""

from __future__ import annotations

import torch

from tilegym.ops import rms_norm as _ops

HIDDEN = 1152
EPS = 1e-6


def rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``Gemma3RMSNorm.forward`` with the model's epsilon."""
    return _ops.rms_norm(hidden_states, weight, EPS, unit_offset=True)


def aot_signatures() -> dict:
    """The kernel this entry point launches, for the model's hidden size (bf16, Gemma's form)."""
    sigs = _ops.aot_signatures(
        hidden_sizes=(HIDDEN,), dtypes=(torch.bfloat16,), unit_offsets=(True,), ops=("plain",)
    )
    return {_ops.plain_kernel(): sigs[_ops.plain_kernel()]}
