"""SmolLM3 RoPE entry point (q and k in one launch) over ``tilegym.ops.rope``.

Only layers with RoPE run it: the NoPE layers (``no_rope_layers`` 0, every 4th) skip it.
"""

from __future__ import annotations

import torch

from tilegym.ops import rope as _ops

HEADS = (16, 4, 128)  # q heads, kv heads, head dim of SmolLM3-3B


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """``apply_rotary_pos_emb(q, k, cos, sin)`` for (B, H, S, D) q/k."""
    return _ops.apply_rope(q, k, cos, sin)


def aot_signatures() -> dict:
    """The RoPE kernels the default dispatch launches for SmolLM3-3B's head layout (bf16)."""
    return _ops.aot_signatures(
        heads=(HEADS,), dtypes=(torch.bfloat16,), partial_rot=(), ops=("rope",)
    )
