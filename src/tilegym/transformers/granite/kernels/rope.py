"""Granite RoPE entry point (q and k in one launch) over ``tilegym.ops.rope``."""

from __future__ import annotations

import torch

from tilegym.ops import rope as _ops

HEADS = (32, 8, 64)  # q heads, kv heads, head dim of granite-3.3-2b-instruct


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """``apply_rotary_pos_emb(q, k, cos, sin)`` for (B, H, S, D) q/k."""
    return _ops.apply_rope(q, k, cos, sin)


def aot_signatures() -> dict:
    """The RoPE kernels the default dispatch launches for granite-3.3-2b's head layout (bf16)."""
    return _ops.aot_signatures(
        heads=(HEADS,), dtypes=(torch.bfloat16,), partial_rot=(), ops=("rope",)
    )
