"""Qwen3-MoE per-head q/k RMSNorm + transpose + RoPE entry point over ``tilegym.ops.rope``."""

from __future__ import annotations

import torch

from tilegym.ops import rope as _ops

HEADS = (32, 4, 128)  # q heads, kv heads, head dim of Qwen3-30B-A3B
EPS = 1e-6


def qk_norm_rope(q, k, q_weight, k_weight, cos, sin):
    """(B, S, H, D) projections -> normed, rotated (B, H, S, D) q and k."""
    return _ops.qk_norm_rope(q, k, q_weight, k_weight, EPS, cos, sin)


def aot_signatures() -> dict:
    """The fused kernels the default dispatch launches for Qwen3-30B-A3B's head layout (bf16)."""
    return _ops.aot_signatures(
        heads=(HEADS,), dtypes=(torch.bfloat16,), partial_rot=(), ops=("qk",)
    )
