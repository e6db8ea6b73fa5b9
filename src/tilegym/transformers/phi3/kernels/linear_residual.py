"""phi3 o_proj and down_proj with the decoder layer's residual add in the GEMM epilogue."""

from __future__ import annotations

import torch

from tilegym.ops import gemm


def o_proj_residual(
    attn_output: torch.Tensor, o_weight: torch.Tensor, residual: torch.Tensor
) -> torch.Tensor:
    """``residual + attn_output @ Wo^T`` ([T, 3072] x [3072, 3072])."""
    return gemm.linear_residual(attn_output, o_weight, residual)


def down_proj_residual(
    act: torch.Tensor, down_weight: torch.Tensor, residual: torch.Tensor
) -> torch.Tensor:
    """``residual + act @ Wd^T`` ([T, 8192] x [3072, 8192])."""
    return gemm.linear_residual(act, down_weight, residual)


def aot_signatures() -> dict:
    """The residual-epilogue kernel at decode and prefill tiles (bf16, the model dtype)."""
    return gemm.aot_signatures(ops=("residual",), dtypes=(torch.bfloat16,))
