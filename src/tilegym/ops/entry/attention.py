"""Shared attention entry points over ``tilegym.ops.attention`` (GQA, any head configuration).

The model itself reaches these kernels through ``tilegym.transformers.attention.enable``; the
Solutions name the functions here, at each family's head configuration (the Definition's
``HQ``, ``HKV``, ``D``) and softmax scale (``entry_kwargs``; default ``D ** -0.5``).
"""

from __future__ import annotations

import torch

from tilegym.ops import attention as _ops
from tilegym.ops.entry import const_axes


def attention_prefill(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, scale: float | None = None
) -> torch.Tensor:
    """Causal GQA attention of a prompt: ``[B, HQ, S, D]`` queries -> ``[B, S, HQ, D]``."""
    return _ops.prefill_attention(query, key, value, scale=scale, causal=True)


def attention_decode(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, scale: float | None = None
) -> torch.Tensor:
    """One new token per sequence over ``T`` cached keys: ``[B, 1, HQ, D]``."""
    return _ops.decode_attention(query, key, value, scale=scale)


def aot_signatures(definition, *, scale: float | None = None) -> dict:
    """Prefill, split-KV decode and reduction kernels at the Definition's head configuration."""
    num_q_heads, num_kv_heads, head_dim = const_axes(definition, "HQ", "HKV", "D")
    return _ops.aot_signatures(head_dim, num_q_heads, num_kv_heads)
