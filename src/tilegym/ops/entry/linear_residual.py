"""Shared o_proj / down_proj entry point with the decoder layer's residual add in the GEMM
epilogue, over ``tilegym.ops.gemm``."""

from __future__ import annotations

import torch

from tilegym.ops import gemm
from tilegym.ops.entry import tensor_dtype


def linear_residual(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``residual + x @ W^T`` in one launch."""
    return gemm.linear_residual(x, weight, residual)


def aot_signatures(definition) -> dict:
    """The residual-epilogue kernel at decode and prefill tiles, in the Definition's dtype."""
    return gemm.aot_signatures(ops=("residual",), dtypes=(tensor_dtype(definition),))
