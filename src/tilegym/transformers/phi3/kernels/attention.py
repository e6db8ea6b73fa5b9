"""Phi-3 attention entry points (Phi-3.5-mini: 32 query heads, 32 kv heads, head_dim 96).

Thin wrappers over ``tilegym.ops.attention`` at this model's head configuration, named by the
Solution files; the model itself uses them through ``tilegym.transformers.attention.enable``
(head_dim 96 runs in 128-wide tiles). Causal only:
Phi-3.5-mini's 262144-token sliding window exceeds its 131072 positions, so it never binds.
"""

from __future__ import annotations

import torch

from tilegym.ops import attention as _ops

NUM_Q_HEADS = 32
NUM_KV_HEADS = 32
HEAD_DIM = 96
SCALE = HEAD_DIM**-0.5


def phi3_attention_prefill(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> torch.Tensor:
    """Causal attention of a prompt: ``[B, 32, S, 96]`` queries -> ``[B, S, 32, 96]``."""
    return _ops.prefill_attention(query, key, value, scale=SCALE, causal=True)


def phi3_attention_decode(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> torch.Tensor:
    """One new token per sequence over ``T`` cached keys: ``[B, 1, 32, 96]``."""
    return _ops.decode_attention(query, key, value, scale=SCALE)


def aot_signatures():
    """Prefill, split-KV decode and reduction kernels at this head configuration."""
    return _ops.aot_signatures(HEAD_DIM, NUM_Q_HEADS, NUM_KV_HEADS)
