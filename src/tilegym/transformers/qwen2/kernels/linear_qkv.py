"""qwen2 fused QKV projection (with the q/k/v biases) entry point over ``tilegym.ops.gemm``.

The patch packs q_proj/k_proj/v_proj weights once into one ``[1536+2*256, 1536]`` weight and
their biases into one ``[2048]`` bias, which the GEMM adds in its epilogue.
"""

from __future__ import annotations

import torch

from tilegym.ops import gemm


def qkv_proj(
    hidden_states: torch.Tensor, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor
) -> torch.Tensor:
    """``hidden_states @ [Wq; Wk; Wv]^T + [bq; bk; bv]`` in one launch: ``[T, 2048]``."""
    return gemm.linear(hidden_states, qkv_weight, qkv_bias)


def aot_signatures() -> dict:
    """The plain-linear kernel at decode and prefill tiles, with and without the bias epilogue
    (bf16, the model dtype)."""
    return gemm.aot_signatures(ops=("linear",), dtypes=(torch.bfloat16,))
