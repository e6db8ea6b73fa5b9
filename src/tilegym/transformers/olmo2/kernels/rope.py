"""OLMo 2 RoPE entry point (q and k in one launch) over ``tilegym.ops.rope``."""

from __future__ import annotations

import torch

from tilegym.ops import rope as _ops

HEADS = (16, 16, 128)  # q heads, kv heads, head dim of OLMo-2-0425-1B


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """``apply_rotary_pos_emb(q, k, cos, sin)`` for ``[B, 16, S, 128]`` q and k (already
    normed over the whole projection)."""
    return _ops.apply_rope(q, k, cos, sin)


def aot_signatures() -> dict:
    """The RoPE kernels the default dispatch launches for OLMo-2-0425-1B's head layout (bf16)."""
    return _ops.aot_signatures(
        heads=(HEADS,), dtypes=(torch.bfloat16,), partial_rot=(), ops=("rope",)
    )
