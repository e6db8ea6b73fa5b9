"""Entry point of the half-split RoPE tables over ``tilegym.ops.rotary_tables``: Llama-form
rotary modules (``tilegym.transformers.rope_tables``) and DeepSeek-V2's complex table
(``tilegym.transformers.mla``).

The model reaches the kernel through its rotary module's forward; a family's
``attention_scaling``, the tables' dtype and whether its tables are half a head wide
(gpt-oss: the left half of the kernel's) are the Solution's ``entry_kwargs``.
"""

from __future__ import annotations

import torch

from tilegym.ops import rotary_tables as _ops
from tilegym.ops.entry import const_axes


def rotary_tables(
    position_ids: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    scaling: float,
    dtype: str = "bfloat16",
    half: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` ``[B, S, R]``: ``cos(pos * inv_freq) * scaling`` and the sine in both
    halves (``R = 2 len(inv_freq)``), in ``dtype``; with ``half`` one half (``R = len(inv_freq)``).
    """
    cos, sin = _ops.rotary_tables(position_ids, inv_freq, scaling, getattr(torch, dtype))
    if half:
        n = inv_freq.shape[0]
        return cos[..., :n], sin[..., :n]
    return cos, sin


def aot_signatures(
    definition, *, scaling: float | None = None, dtype: str = "bfloat16", half: bool = False
) -> dict:
    """The kernel at the Definition's table width ``R`` (the kernel's rope width: ``2 R`` with
    ``half``) for tables in ``dtype`` (both token tiles; ``inv_freq`` fp32 as transformers keeps
    it, or bf16 after a cast of the model)."""
    (width,) = const_axes(definition, "R")
    rope = 2 * width if half else width
    return _ops.aot_signatures(rope, (getattr(torch, dtype),), (torch.float32, torch.bfloat16))
