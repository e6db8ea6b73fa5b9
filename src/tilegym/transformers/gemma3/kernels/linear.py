"""gemma3 o_proj, down_proj and lm_head entry points over ``tilegym.ops.gemm``.

Gemma 3 normalizes each sub-block's output before the residual add, so o_proj and down_proj are
plain GEMMs (no residual epilogue); the norm and the add run in ``norm_add``.
"""

from __future__ import annotations

import torch

from tilegym.ops import gemm


def o_proj(attn_output: torch.Tensor, o_weight: torch.Tensor) -> torch.Tensor:
    """``attn_output @ Wo^T`` ([T, 1024] x [1152, 1024])."""
    return gemm.linear(attn_output, o_weight)


def down_proj(act: torch.Tensor, down_weight: torch.Tensor) -> torch.Tensor:
    """``act @ Wd^T`` ([T, 6912] x [1152, 6912])."""
    return gemm.linear(act, down_weight)


def lm_head(hidden_states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``hidden_states @ W_vocab^T`` ([T, 1152] x [262144, 1152], tied to the embedding)."""
    return gemm.linear(hidden_states, weight)


def aot_signatures() -> dict:
    """The plain-linear kernel at decode and prefill tiles (bf16, the model dtype)."""
    return gemm.aot_signatures(ops=("linear",), dtypes=(torch.bfloat16,))
