"""phi3 QKV projection entry point over ``tilegym.ops.gemm``.

Phi-3 stores ``qkv_proj`` packed as ``[3072+2*3072, 3072]`` = ``[q; k; v]``, the layout the GEMM
takes: the model's own weight is used as it is (no repacking).
"""

from __future__ import annotations

import torch

from tilegym.ops import gemm


def qkv_proj(hidden_states: torch.Tensor, qkv_weight: torch.Tensor) -> torch.Tensor:
    """``hidden_states @ W_qkv^T`` in one launch: ``[T, 9216]``."""
    return gemm.linear(hidden_states, qkv_weight)


def aot_signatures() -> dict:
    """The plain-linear kernel at decode and prefill tiles (bf16, the model dtype)."""
    return gemm.aot_signatures(ops=("linear",), dtypes=(torch.bfloat16,))
