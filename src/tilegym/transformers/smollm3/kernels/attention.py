"""SmolLM3 attention entry points (16 query heads, 4 kv heads, head_dim 128).

Thin wrappers over ``tilegym.ops.attention`` at this model's head configuration, named by the
Solution files; the model itself uses them through ``tilegym.transformers.attention.enable``,
which passes the module's ``scaling`` as the softmax scale.
"""

from __future__ import annotations

import torch

from tilegym.ops import attention as _ops

NUM_Q_HEADS = 16
NUM_KV_HEADS = 4
HEAD_DIM = 128
SCALE = HEAD_DIM**-0.5


def smollm3_attention_prefill(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> torch.Tensor:
    """Causal GQA attention of a prompt: ``[B, 16, S, 128]`` queries -> ``[B, S, 16, 128]``."""
    return _ops.prefill_attention(query, key, value, scale=SCALE, causal=True)


def smollm3_attention_decode(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> torch.Tensor:
    """One new token per sequence over ``T`` cached keys: ``[B, 1, 16, 128]``."""
    return _ops.decode_attention(query, key, value, scale=SCALE)


def aot_signatures():
    """Prefill, split-KV decode and reduction kernels at this head configuration."""
    return _ops.aot_signatures(HEAD_DIM, NUM_Q_HEADS, NUM_KV_HEADS)
