"""Sigmoid gates of Qwen3.5 / Qwen3-Next: ``x * sigmoid(g)`` and ``residual + x * sigmoid(g)``.

Two products the compiled decode step left to Inductor (about 0.7% of qwen3_next's GPU time on
the H200), each one launch here:

- the full-attention layers' output gate, ``attn_output * torch.sigmoid(gate)`` before
  ``o_proj`` (``Qwen3NextAttention``): the gate is the second half of each head of the q
  projection, read in place as a strided ``[T, H, D]`` view (PyTorch copies it first);
- the shared expert's gate, ``residual + sigmoid(shared_expert_gate(x)) * shared_expert(x)``
  (one logit per token, ``[T, 1]``) with the residual the experts op then adds to.

Rounding is the eager ops': the sigmoid rounded to the output dtype, then the product, then
the sum, each once (fp32 in between).
"""

from __future__ import annotations

import cuda.tile as ct
import torch

from tilegym.ops._common import (
    AOT_DTYPES,
    PAD_ZERO,
    array_sig,
    check_activation,
    next_pow2,
    signature,
    stream,
)

ConstInt = ct.Constant[int]
#: elements a block (rows x columns), columns up to ``MAX_TILE_N``
BLOCK_ELEMENTS = 4096
MAX_TILE_N = 1024


@ct.function
def _rounded_sigmoid(g, dtype):
    """sigmoid(g) in fp32, rounded once to ``dtype`` (``torch.sigmoid`` on a ``dtype`` tensor)."""
    return (1.0 / (1.0 + ct.exp(-g))).astype(dtype).astype(ct.float32)


@ct.kernel
def sigmoid_gate_kernel(X, G, Out, TM: ConstInt, TN: ConstInt):
    """``Out = x * sigmoid(g)`` on ``[T, H, D]`` views, one (rows, head, columns) tile a block."""
    i = ct.bid(0)
    h = ct.bid(1)
    j = ct.bid(2)
    x = ct.load(X, (i, h, j), (TM, 1, TN), padding_mode=PAD_ZERO).astype(ct.float32)
    g = ct.load(G, (i, h, j), (TM, 1, TN), padding_mode=PAD_ZERO).astype(ct.float32)
    ct.store(Out, (i, h, j), (x * _rounded_sigmoid(g, Out.dtype)).astype(Out.dtype))


@ct.kernel
def sigmoid_gate_add_kernel(Res, X, G, Out, TM: ConstInt, TN: ConstInt):
    """``Out = res + x * sigmoid(g)`` on ``[T, N]``, ``g`` one logit a row (``[T, 1]``)."""
    i = ct.bid(0)
    j = ct.bid(1)
    x = ct.load(X, (i, j), (TM, TN), padding_mode=PAD_ZERO).astype(ct.float32)
    r = ct.load(Res, (i, j), (TM, TN), padding_mode=PAD_ZERO).astype(ct.float32)
    g = ct.load(G, (i, 0), (TM, 1), padding_mode=PAD_ZERO).astype(ct.float32)
    y = (x * _rounded_sigmoid(g, Out.dtype)).astype(Out.dtype).astype(ct.float32)
    ct.store(Out, (i, j), (r + y).astype(Out.dtype))


def tile_sizes(n: int) -> tuple[int, int]:
    """(rows, columns) of a block: up to ``MAX_TILE_N`` columns, about 4K elements."""
    tn = min(MAX_TILE_N, next_pow2(n))
    return max(1, BLOCK_ELEMENTS // tn), tn


def _unit_last(name: str, t: torch.Tensor) -> None:
    if t.stride(-1) != 1:
        raise ValueError(f"{name} needs a unit last stride, got strides {t.stride()}")


def sigmoid_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(gate)`` for ``x`` ``[..., H * D]`` and ``gate`` ``[..., H, D]`` (any
    strides with a unit last one: the q projection's gate halves in place); ``[..., H * D]``."""
    if gate.dim() < 2 or x.shape[:-1] != gate.shape[:-2]:
        raise ValueError(f"gate {tuple(gate.shape)} must be [..., H, D] over x {tuple(x.shape)}")
    heads, d = gate.shape[-2], gate.shape[-1]
    if x.shape[-1] != heads * d or x.dtype != gate.dtype:
        raise ValueError(f"x {tuple(x.shape)} {x.dtype} must be [..., {heads * d}] {gate.dtype}")
    _unit_last("gate", gate)
    check_activation("x", x)
    check_activation("gate", gate)
    t = x.numel() // max(x.shape[-1], 1)
    x3 = x.reshape(t, heads, d)
    _unit_last("x", x3)
    g3 = gate.reshape(t, heads, d)
    out = torch.empty((t, heads, d), dtype=x.dtype, device=x.device)
    if out.numel():
        tm, tn = tile_sizes(d)
        grid = (-(-t // tm), heads, -(-d // tn))
        ct.launch(stream(), grid, sigmoid_gate_kernel, (x3, g3, out, tm, tn))
    return out.view(x.shape)


def sigmoid_gate_add(residual: torch.Tensor, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``residual + x * sigmoid(gate)`` for ``residual``, ``x`` ``[..., N]`` and ``gate``
    ``[..., 1]`` (one logit a row); a new tensor shaped like ``x``."""
    if residual.shape != x.shape or gate.shape != (*x.shape[:-1], 1):
        raise ValueError(
            f"residual {tuple(residual.shape)}, x {tuple(x.shape)} and gate {tuple(gate.shape)} "
            "must be [..., N], [..., N], [..., 1]"
        )
    if len({residual.dtype, x.dtype, gate.dtype}) != 1:
        raise ValueError(f"dtypes differ: {residual.dtype}, {x.dtype}, {gate.dtype}")
    for name, t in (("residual", residual), ("x", x), ("gate", gate)):
        check_activation(name, t)
    n = x.shape[-1]
    x2, r2, g2 = (t.reshape(-1, t.shape[-1]) for t in (x, residual, gate))
    for name, t in (("x", x2), ("residual", r2)):
        _unit_last(name, t)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if out.numel():
        tm, tn = tile_sizes(n)
        grid = (-(-x2.shape[0] // tm), -(-n // tn), 1)
        ct.launch(stream(), grid, sigmoid_gate_add_kernel, (r2, x2, g2, out, tm, tn))
    return out.view(x.shape)


def sigmoid_gate_reference(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """The PyTorch ops the gate kernel replaces (``Qwen3NextAttention``'s output gate)."""
    return x * torch.sigmoid(gate.reshape(x.shape))


def sigmoid_gate_add_reference(
    residual: torch.Tensor, x: torch.Tensor, gate: torch.Tensor
) -> torch.Tensor:
    """The PyTorch ops the gate-add kernel replaces (the shared expert's gate, then the sum)."""
    return residual + torch.sigmoid(gate) * x


def aot_signatures(dims=((16, 256, 2048),), dtypes=AOT_DTYPES) -> dict:
    """Signatures at ``(heads, head_dim, hidden)``: Qwen3.5-0.8B / Qwen3-Next's heads of 256
    (the gate a strided view of the q projection) and hidden size."""
    gate_sigs, add_sigs = [], []
    for dt in dtypes:
        a3, a2 = array_sig(dt, 3), array_sig(dt, 2)
        for _heads, head_dim, hidden in dims:
            gate_sigs.append(signature(a3, a3, a3, *tile_sizes(head_dim)))
            add_sigs.append(signature(a2, a2, a2, a2, *tile_sizes(hidden)))
    return {sigmoid_gate_kernel: gate_sigs, sigmoid_gate_add_kernel: add_sigs}
