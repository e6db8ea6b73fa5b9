"""Shared MLP gate/up projection with SiLU-and-mul fused in the GEMM epilogue.

The patch packs gate_proj/up_proj weights once into one ``[2*I, H]`` weight; the ``[T, 2*I]``
intermediate never reaches memory.
"""

from __future__ import annotations

import torch

from tilegym.ops import gemm
from tilegym.ops.entry import tensor_dtype


def gate_up_silu(x: torch.Tensor, gate_up_weight: torch.Tensor) -> torch.Tensor:
    """``silu(x @ Wg^T) * (x @ Wu^T)`` for ``gate_up_weight = [Wg; Wu]``."""
    return gemm.fused_gate_up_silu(x, gate_up_weight)


def aot_signatures(definition) -> dict:
    """The fused gate-up kernel at decode and prefill tiles, in the Definition's dtype."""
    return gemm.aot_signatures(ops=("gated",), dtypes=(tensor_dtype(definition),))
