"""Mistral RoPE entry point (q and k in one launch) over ``tilegym.ops.rope``."""

from __future__ import annotations

import torch

from tilegym.ops import rope as _ops

HEADS = (32, 8, 128)  # q heads, kv heads, head dim of Mistral-7B-v0.3


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """``apply_rotary_pos_emb(q, k, cos, sin)`` for ``[B, 32, S, 128]`` q and
    ``[B, 8, S, 128]`` k."""
    return _ops.apply_rope(q, k, cos, sin)


def aot_signatures() -> dict:
    """The RoPE kernels the default dispatch launches for Mistral-7B-v0.3's head layout (bf16)."""
    return _ops.aot_signatures(
        heads=(HEADS,), dtypes=(torch.bfloat16,), partial_rot=(), ops=("rope",)
    )
