"""Entry point of the half-split RoPE tables of an interleaved (complex) rotary embedding
(DeepSeek-V2) over ``tilegym.ops.rotary_tables``.

The model reaches the kernel through its rotary module's forward
(``tilegym.transformers.mla.make_rotary_forward``); a family's ``attention_scaling`` and the
tables' dtype are the Solution's ``entry_kwargs``.
"""

from __future__ import annotations

import torch

from tilegym.ops import rotary_tables as _ops
from tilegym.ops.entry import const_axes


def rotary_tables(
    position_ids: torch.Tensor, inv_freq: torch.Tensor, *, scaling: float, dtype: str = "bfloat16"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` ``[B, S, R]``: the real and imaginary parts of ``polar(1, pos *
    inv_freq) * scaling``, each repeated, in ``dtype``."""
    return _ops.rotary_tables(position_ids, inv_freq, scaling, getattr(torch, dtype))


def aot_signatures(definition, *, scaling: float | None = None, dtype: str = "bfloat16") -> dict:
    """The kernel at the Definition's rope width ``R`` for tables in ``dtype`` (both token
    tiles; ``inv_freq`` fp32 as transformers keeps it, or bf16 after a cast of the model)."""
    (rope,) = const_axes(definition, "R")
    return _ops.aot_signatures(rope, (getattr(torch, dtype),), (torch.float32, torch.bfloat16))
