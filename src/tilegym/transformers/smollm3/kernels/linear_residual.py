"""smollm3 o_proj and down_proj with the decoder layer's residual add in the GEMM epilogue."""

from __future__ import annotations

import torch

from tilegym.ops import gemm


def o_proj_residual(
    attn_output: torch.Tensor, o_weight: torch.Tensor, residual: torch.Tensor
) -> torch.Tensor:
    """``residual + (attn_output @ Wo^T)`` ([T, 2048] x [2048, 2048])."""
    return gemm.linear_residual(attn_output, o_weight, residual)


def down_proj_residual(
    act: torch.Tensor, down_weight: torch.Tensor, residual: torch.Tensor
) -> torch.Tensor:
    """``residual + (act @ Wd^T)`` ([T, 11008] x [2048, 11008])."""
    return gemm.linear_residual(act, down_weight, residual)


def aot_signatures() -> dict:
    """The residual-epilogue kernel at decode and prefill tiles (bf16, the model dtype)."""
    return gemm.aot_signatures(ops=("residual",), dtypes=(torch.bfloat16,))
