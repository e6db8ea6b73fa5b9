"""Shared RoPE entry points over ``tilegym.ops.rope``: q and k in one launch, and the per-head
q/k RMSNorm + transpose + RoPE of Qwen3-style (and Gemma 3) attention."""

from __future__ import annotations

import torch

from tilegym.ops import rope as _ops
from tilegym.ops.entry import const_axes, tensor_dtype


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """``apply_rotary_pos_emb(q, k, cos, sin)`` for ``[B, H, S, D]`` q and k: tables of ``D``
    columns, or fewer (partial rotary: the first ``R`` dims rotate)."""
    return _ops.apply_rope(q, k, cos, sin)


def aot_signatures(definition) -> dict:
    """The RoPE kernels the default dispatch launches at the Definition's (``HQ``, ``HK``,
    ``D``) head layout and dtype; with a const axis ``R`` below ``D`` (partial rotary, Qwen3.5:
    tables of ``R`` columns, the rest of each head passed through) at that layout instead."""
    hq, hk, d = const_axes(definition, "HQ", "HK", "D")
    rot = const_axes(definition, "R")[0] if "R" in definition.axes else d
    heads, partial = (((hq, hk, d),), ()) if rot == d else ((), ((hq, hk, d, rot),))
    return _ops.aot_signatures(
        heads=heads, dtypes=(tensor_dtype(definition),), partial_rot=partial, ops=("rope",)
    )
