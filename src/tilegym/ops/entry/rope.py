"""Shared RoPE entry points over ``tilegym.ops.rope``: q and k in one launch, and the per-head
q/k RMSNorm + transpose + RoPE of Qwen3-style (and Gemma 3) attention."""

from __future__ import annotations

import torch

from tilegym.ops import rope as _ops
from tilegym.ops.entry import const_axes, tensor_dtype


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """``apply_rotary_pos_emb(q, k, cos, sin)`` (full rotary over the head dim) for
    ``[B, H, S, D]`` q and k."""
    return _ops.apply_rope(q, k, cos, sin)


def aot_signatures(definition) -> dict:
    """The RoPE kernels the default dispatch launches at the Definition's (``HQ``, ``HK``,
    ``D``) head layout and dtype."""
    heads = const_axes(definition, "HQ", "HK", "D")
    return _ops.aot_signatures(
        heads=(heads,), dtypes=(tensor_dtype(definition),), partial_rot=(), ops=("rope",)
    )
