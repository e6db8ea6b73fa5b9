"""granite fused QKV projection entry point over ``tilegym.ops.gemm``.

The patch packs q_proj/k_proj/v_proj weights once into one ``[2048+2*512, 2048]`` weight.
"""

from __future__ import annotations

import torch

from tilegym.ops import gemm


def qkv_proj(hidden_states: torch.Tensor, qkv_weight: torch.Tensor) -> torch.Tensor:
    """``hidden_states @ [Wq; Wk; Wv]^T`` in one launch: ``[T, 3072]``."""
    return gemm.linear(hidden_states, qkv_weight)


def aot_signatures() -> dict:
    """The plain-linear kernel at decode and prefill tiles (bf16, the model dtype)."""
    return gemm.aot_signatures(ops=("linear",), dtypes=(torch.bfloat16,))
