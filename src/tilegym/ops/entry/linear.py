"""Shared plain-GEMM entry point over ``tilegym.ops.gemm`` (``[T, K] x [N, K]``, any shape)."""

from __future__ import annotations

import torch

from tilegym.ops import gemm
from tilegym.ops.entry import tensor_dtype


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W^T (+ bias)`` in one launch: a fused QKV projection (packed ``[Wq; Wk; Wv]``, with
    the packed biases where the family has them), o_proj/down_proj without a residual epilogue,
    an MoE router or an lm_head."""
    return gemm.linear(x, weight, bias)


def aot_signatures(definition) -> dict:
    """The plain-linear kernel at decode and prefill tiles, with and without the bias epilogue,
    in the Definition's dtype (the GEMM tiles do not depend on the shape)."""
    return gemm.aot_signatures(ops=("linear",), dtypes=(tensor_dtype(definition),))
