"""Gemma 3 attention entry points (gemma-3-1b: 4 query heads, 1 kv head, head_dim 256).

Thin wrappers over ``tilegym.ops.attention`` at this model's head configuration, named by the
Solution files; the model itself uses them through ``tilegym.transformers.attention.enable``
(its ``SUPPORTED_HEAD_DIMS`` include 256). The scale is
``query_pre_attn_scalar ** -0.5`` (256 for gemma-3-1b, equal to the head dim).

Causal only, as the Definitions: gemma-3-1b's sliding layers (window 512, 5 of every 6) equal
this while a prompt (prefill) or the cache (decode) holds at most 512 tokens; the model patch
passes their window to the kernels itself.
"""

from __future__ import annotations

import torch

from tilegym.ops import attention as _ops

NUM_Q_HEADS = 4
NUM_KV_HEADS = 1
HEAD_DIM = 256
QUERY_PRE_ATTN_SCALAR = 256
SCALE = QUERY_PRE_ATTN_SCALAR**-0.5


def gemma3_attention_prefill(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> torch.Tensor:
    """Causal GQA attention of a prompt: ``[B, 4, S, 256]`` queries -> ``[B, S, 4, 256]``."""
    return _ops.prefill_attention(query, key, value, scale=SCALE, causal=True)


def gemma3_attention_decode(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> torch.Tensor:
    """One new token per sequence over ``T`` cached keys: ``[B, 1, 4, 256]``."""
    return _ops.decode_attention(query, key, value, scale=SCALE)


def aot_signatures():
    """Prefill, split-KV decode and reduction kernels at this head configuration."""
    return _ops.aot_signatures(HEAD_DIM, NUM_Q_HEADS, NUM_KV_HEADS)
