"""Entry points of the sigmoid gates (Qwen3.5, Qwen3-Next) over ``tilegym.ops.sigmoid_gate``:
the attention output gate ``attn_output * sigmoid(gate)``, the gate being the second half of
each head of the q projection, read in place; and the shared expert's gate and sum
``residual + sigmoid(gate_logit) * shared`` (Qwen3-Next)."""

from __future__ import annotations

import torch

from tilegym.ops import sigmoid_gate as _ops
from tilegym.ops.entry import const_axes, tensor_dtype


def sigmoid_gate(attn_output: torch.Tensor, q_gate: torch.Tensor) -> torch.Tensor:
    """``attn_output [T, H * D] * sigmoid(gate)``, ``gate`` the second half of each head of the
    q projection ``q_gate [T, H, 2 D]``."""
    d = q_gate.shape[-1] // 2
    return _ops.sigmoid_gate(attn_output, q_gate[..., d:])


def sigmoid_gate_add(
    residual: torch.Tensor, shared: torch.Tensor, gate_logit: torch.Tensor
) -> torch.Tensor:
    """``residual [T, H] + sigmoid(gate_logit [T, 1]) * shared [T, H]``."""
    return _ops.sigmoid_gate_add(residual, shared, gate_logit)


def aot_signatures(definition) -> dict:
    """The Definition's kernel at its dtype: the output gate (op ``sigmoid_gate``) at heads
    ``H`` of size ``D``, or the gate-add (op ``sigmoid_gate_add``) at hidden size ``H``."""
    dtypes = (tensor_dtype(definition),)
    if definition.op_type == "sigmoid_gate_add":
        (hidden,) = const_axes(definition, "H")
        kernel = _ops.sigmoid_gate_add_kernel
        sigs = _ops.aot_signatures(dims=((1, 1, hidden),), dtypes=dtypes)
    else:
        heads, d = const_axes(definition, "H", "D")
        kernel = _ops.sigmoid_gate_kernel
        sigs = _ops.aot_signatures(dims=((heads, d, heads * d),), dtypes=dtypes)
    return {kernel: sigs[kernel]}
