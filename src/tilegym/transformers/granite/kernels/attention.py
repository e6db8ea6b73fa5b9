"""Granite attention entry points (32 query heads, 8 kv heads, head_dim 64).

Thin wrappers over ``tilegym.ops.attention`` at this model's head configuration, named by the
Solution files; the model itself uses them through ``tilegym.transformers.attention.enable``,
which passes the module's ``scaling`` as the softmax scale.
"""

from __future__ import annotations

import torch

from tilegym.ops import attention as _ops

NUM_Q_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 64
SCALE = 0.015625  # config.attention_multiplier (1/head_dim), not 1/sqrt(head_dim)


def granite_attention_prefill(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> torch.Tensor:
    """Causal GQA attention of a prompt: ``[B, 32, S, 64]`` queries -> ``[B, S, 32, 64]``."""
    return _ops.prefill_attention(query, key, value, scale=SCALE, causal=True)


def granite_attention_decode(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> torch.Tensor:
    """One new token per sequence over ``T`` cached keys: ``[B, 1, 32, 64]``."""
    return _ops.decode_attention(query, key, value, scale=SCALE)


def aot_signatures():
    """Prefill, split-KV decode and reduction kernels at this head configuration."""
    return _ops.aot_signatures(HEAD_DIM, NUM_Q_HEADS, NUM_KV_HEADS)
