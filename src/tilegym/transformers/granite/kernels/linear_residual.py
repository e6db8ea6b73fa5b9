"""granite o_proj and down_proj with the decoder layer's residual add in the GEMM epilogue.

Granite adds ``residual + out * residual_multiplier``: the patch folds the multiplier into a
copy of each weight, scaled once when it is applied (``FusedWeights.scaled``), so the model's
GEMM reads the scaled weight; these entry points, given the checkpoint's weight, scale it per
call.
"""

from __future__ import annotations

import torch

from tilegym.ops import gemm

RESIDUAL_MULTIPLIER = 0.22


def o_proj_residual(
    attn_output: torch.Tensor, o_weight: torch.Tensor, residual: torch.Tensor
) -> torch.Tensor:
    """``residual + (attn_output @ Wo^T) * 0.22`` ([T, 2048] x [2048, 2048])."""
    return gemm.linear_residual(attn_output, o_weight * RESIDUAL_MULTIPLIER, residual)


def down_proj_residual(
    act: torch.Tensor, down_weight: torch.Tensor, residual: torch.Tensor
) -> torch.Tensor:
    """``residual + (act @ Wd^T) * 0.22`` ([T, 8192] x [2048, 8192])."""
    return gemm.linear_residual(act, down_weight * RESIDUAL_MULTIPLIER, residual)


def aot_signatures() -> dict:
    """The residual-epilogue kernel at decode and prefill tiles (bf16, the model dtype)."""
    return gemm.aot_signatures(ops=("residual",), dtypes=(torch.bfloat16,))
