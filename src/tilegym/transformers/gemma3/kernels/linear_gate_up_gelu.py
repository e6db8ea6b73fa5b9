"""gemma3 MLP gate/up projection with GELU-tanh-and-mul fused in the GEMM epilogue.

The patch packs gate_proj/up_proj weights once into one ``[2*6912, 1152]`` weight; the
``[T, 2*6912]`` intermediate never reaches memory.
"""

from __future__ import annotations

import torch

from tilegym.ops import gemm


def gate_up_gelu_tanh(x: torch.Tensor, gate_up_weight: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(x @ Wg^T) * (x @ Wu^T)`` for ``gate_up_weight = [Wg; Wu]``: ``[T, 6912]``."""
    return gemm.fused_gate_up_gelu_tanh(x, gate_up_weight)


def aot_signatures() -> dict:
    """The fused gate-up kernel with the GELU-tanh epilogue at decode and prefill tiles (bf16)."""
    return gemm.aot_signatures(ops=("gated_gelu",), dtypes=(torch.bfloat16,))
