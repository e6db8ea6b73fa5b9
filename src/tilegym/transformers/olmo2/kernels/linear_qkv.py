"""olmo2 fused QKV projection entry point over ``tilegym.ops.gemm``.

The patch packs q_proj/k_proj/v_proj weights once into one ``[3*2048, 2048]`` weight; the q/k
norms over the whole projections follow on its q and k columns.
"""

from __future__ import annotations

import torch

from tilegym.ops import gemm


def qkv_proj(hidden_states: torch.Tensor, qkv_weight: torch.Tensor) -> torch.Tensor:
    """``hidden_states @ [Wq; Wk; Wv]^T`` in one launch: ``[T, 6144]``."""
    return gemm.linear(hidden_states, qkv_weight)


def aot_signatures() -> dict:
    """The plain-linear kernel at decode and prefill tiles (bf16, the model dtype)."""
    return gemm.aot_signatures(ops=("linear",), dtypes=(torch.bfloat16,))
