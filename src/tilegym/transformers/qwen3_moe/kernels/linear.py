"""qwen3_moe router-logits and lm_head projections over ``tilegym.ops.gemm``."""

from __future__ import annotations

import torch

from tilegym.ops import gemm


def router_logits(hidden_states: torch.Tensor, router_weight: torch.Tensor) -> torch.Tensor:
    """The MoE router's linear: ``hidden_states @ W_router^T`` ([T, 2048] x [128, 2048])."""
    return gemm.linear(hidden_states, router_weight)


def lm_head(hidden_states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``hidden_states @ W_vocab^T`` ([T, 2048] x [151936, 2048], untied)."""
    return gemm.linear(hidden_states, weight)


def aot_signatures() -> dict:
    """The plain-linear kernel at decode and prefill tiles (bf16, the model dtype)."""
    return gemm.aot_signatures(ops=("linear",), dtypes=(torch.bfloat16,))
