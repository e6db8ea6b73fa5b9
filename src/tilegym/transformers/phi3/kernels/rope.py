"""Phi-3 RoPE entry point (q and k in one launch) over ``tilegym.ops.rope``."""

from __future__ import annotations

import torch

from tilegym.ops import rope as _ops

HEADS = (32, 32, 96)  # q heads, kv heads, head dim of Phi-3.5-mini


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """``apply_rotary_pos_emb(q, k, cos, sin)`` (full rotary over the head dim) for
    ``[B, 32, S, 96]`` q and k."""
    return _ops.apply_rope(q, k, cos, sin)


def aot_signatures() -> dict:
    """The RoPE kernels the default dispatch launches for Phi-3.5-mini's head layout (bf16)."""
    return _ops.aot_signatures(
        heads=(HEADS,), dtypes=(torch.bfloat16,), partial_rot=(), ops=("rope",)
    )
