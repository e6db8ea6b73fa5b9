"""Gemma 3 per-head q/k RMSNorm + transpose + RoPE entry point over ``tilegym.ops.rope``.

The norms are Gemma's (``1 + weight``); cos/sin are the layer type's table (local base 1e4 on
sliding-window layers, global 1e6 on full-attention layers), whichever the model hands the layer.
"""

from __future__ import annotations

import torch

from tilegym.ops import rope as _ops

HEADS = (4, 1, 256)  # q heads, kv heads, head dim of gemma-3-1b
EPS = 1e-6


def qk_norm_rope(q, k, q_weight, k_weight, cos, sin):
    """(B, S, H, D) projections -> normed, rotated (B, H, S, D) q and k."""
    return _ops.qk_norm_rope(q, k, q_weight, k_weight, EPS, cos, sin, unit_offset=True)


def aot_signatures() -> dict:
    """The fused kernels the default dispatch launches for gemma-3-1b's head layout (bf16)."""
    return _ops.aot_signatures(
        heads=(HEADS,), dtypes=(torch.bfloat16,), partial_rot=(), ops=("qk",), unit_offsets=(True,)
    )
