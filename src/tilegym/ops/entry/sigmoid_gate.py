"""Entry point of the attention output gate (Qwen3.5, Qwen3-Next) over
``tilegym.ops.sigmoid_gate``: ``attn_output * sigmoid(gate)``, the gate being the second half
of each head of the q projection, read in place."""

from __future__ import annotations

import torch

from tilegym.ops import sigmoid_gate as _ops
from tilegym.ops.entry import const_axes, tensor_dtype


def sigmoid_gate(attn_output: torch.Tensor, q_gate: torch.Tensor) -> torch.Tensor:
    """``attn_output [T, H * D] * sigmoid(gate)``, ``gate`` the second half of each head of the
    q projection ``q_gate [T, H, 2 D]``."""
    d = q_gate.shape[-1] // 2
    return _ops.sigmoid_gate(attn_output, q_gate[..., d:])


def aot_signatures(definition) -> dict:
    """The gate kernel at the Definition's heads ``H`` and head size ``D`` and dtype."""
    heads, d = const_axes(definition, "H", "D")
    sigs = _ops.aot_signatures(dims=((heads, d, heads * d),), dtypes=(tensor_dtype(definition),))
    return {_ops.sigmoid_gate_kernel: sigs[_ops.sigmoid_gate_kernel]}
