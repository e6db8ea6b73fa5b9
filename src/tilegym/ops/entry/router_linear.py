"""Entry points of a MoE router's fp32 linear from bf16/fp16 operands, and of DeepSeek-V2's
greedy routing fused after it, over ``tilegym.ops.router_linear``.

The model calls ``tilegym.ops.library.router_logits`` / ``router_greedy`` from its sparse
block (``tilegym.transformers.mla``). The greedy entry point returns the routing as the
experts see it, ``[T, E]`` with each token's weight at its chosen experts (0 elsewhere): the
order of the ids is free, and two experts whose logits tie within the fp32 sums' rounding at the
k-th place swap weights far below the bar (the kernel's ids are exact for its logits).
"""

from __future__ import annotations

import torch

from tilegym.ops import router_linear as _ops
from tilegym.ops.deepseek_route import dense_weights
from tilegym.ops.entry import const_axes, tensor_dtype


def router_logits(hidden_states: torch.Tensor, router_weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(x.float(), weight.float())`` of ``[T, H]`` and ``[E, H]``: fp32 ``[T, E]``."""
    return _ops.router_logits(hidden_states, router_weight)


def router_greedy(
    hidden_states: torch.Tensor, router_weight: torch.Tensor, *, top_k: int, scaling: float
) -> torch.Tensor:
    """The ``top_k`` largest softmax scores of the fp32 logits times ``scaling``, at their
    experts of an fp32 ``[T, E]`` (0 elsewhere)."""
    weights, ids = _ops.router_greedy(hidden_states, router_weight, top_k, scaling)
    return dense_weights(weights, ids, router_weight.shape[0])


def aot_signatures(definition, *, top_k: int | None = None, scaling: float | None = None) -> dict:
    """Both launches at the Definition's experts ``E`` (and ``top_k``; 1 for the logits) in its
    dtype, at the decode and prefill tiles."""
    (experts,) = const_axes(definition, "E")
    return _ops.aot_signatures(experts, top_k or 1, (tensor_dtype(definition),))
