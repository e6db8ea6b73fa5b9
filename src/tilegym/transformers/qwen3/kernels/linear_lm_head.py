"""qwen3 lm_head projection (vocab 151936, tied to the token embedding) entry point."""

from __future__ import annotations

import torch

from tilegym.ops import gemm


def lm_head(hidden_states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``hidden_states @ W_vocab^T`` ([T, 1024] x [151936, 1024])."""
    return gemm.linear(hidden_states, weight)


def aot_signatures() -> dict:
    """The plain-linear kernel at decode and prefill tiles (bf16, the model dtype)."""
    return gemm.aot_signatures(ops=("linear",), dtypes=(torch.bfloat16,))
