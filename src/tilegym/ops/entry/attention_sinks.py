"""Entry points of attention with sinks (gpt-oss) over ``tilegym.ops.attention_sinks``.

The model reaches these kernels through ``tilegym.transformers.attention`` (the module's sinks
arrive as ``s_aux``); the Solutions name the functions here at a family's head configuration
(the Definition's ``HQ``, ``HKV``, ``D``), softmax scale and sliding window (``entry_kwargs``;
a window of 0 is full attention).
"""

from __future__ import annotations

import torch

from tilegym.ops import attention_sinks as _ops
from tilegym.ops.entry import const_axes


def attention_sinks_prefill(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    sinks: torch.Tensor,
    *,
    scale: float | None = None,
    window: int = 0,
) -> torch.Tensor:
    """Causal GQA attention of a prompt with per-head sinks ``[HQ]``: ``[B, HQ, S, D]`` queries
    -> ``[B, S, HQ, D]``."""
    return _ops.prefill_attention_sinks(
        query, key, value, sinks, scale=scale, causal=True, window=window or None
    )


def attention_sinks_decode(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    sinks: torch.Tensor,
    *,
    scale: float | None = None,
    window: int = 0,
) -> torch.Tensor:
    """One new token per sequence over ``T`` cached keys, with per-head sinks: ``[B, 1, HQ, D]``."""
    return _ops.decode_attention_sinks(query, key, value, sinks, scale=scale, window=window or None)


def aot_signatures(definition, *, scale: float | None = None, window: int = 0) -> dict:
    """The sink prefill kernel, the shared decode kernel's partial-output variants and the sink
    reduction at the Definition's head configuration."""
    num_q_heads, num_kv_heads, head_dim = const_axes(definition, "HQ", "HKV", "D")
    return _ops.aot_signatures(head_dim, num_q_heads, num_kv_heads)
