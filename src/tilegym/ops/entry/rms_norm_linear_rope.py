"""Shared entry point of a pre-norm layer's input RMSNorm, its QKV projection and RoPE (with
per-head q/k norms before it where the Definition has their weights) over
``tilegym.ops.gemm.rms_norm_linear_rope`` (Definitions ``[T, H]``, ``[H]``, ``[NQKV, H]``,
``[T, D]``, ``[T, D]``, then ``[D]``, ``[D]`` for the head norms; axes ``HQ``, ``HK``, ``D``)."""

from __future__ import annotations

import torch

from tilegym.ops import gemm
from tilegym.ops.entry import const_axes, tensor_dtype


def rms_norm_linear_rope(
    hidden_states: torch.Tensor,
    norm_weight: torch.Tensor,
    qkv_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    *,
    eps: float,
    rotated_heads: int,
    q_heads: int = 0,
    head_eps: float = 0.0,
    unit_offset: bool = False,
) -> torch.Tensor:
    """``linear(RMSNorm(x), W_qkv)`` with RoPE on its first ``rotated_heads`` (q's and k's)
    heads, each RMS-normed first where ``q_norm_weight`` / ``k_norm_weight`` are given (the
    first ``q_heads`` with q's): one launch, the rotation in the GEMV's epilogue."""
    heads = None
    if q_norm_weight is not None:
        heads = gemm.HeadNorms(q_norm_weight, k_norm_weight, head_eps, q_heads, unit_offset)
    return gemm.rms_norm_linear_rope(
        hidden_states, norm_weight, eps, qkv_weight, None, cos, sin, rotated_heads,
        unit_offset=unit_offset, head_norms=heads,
    )  # fmt: skip


def aot_signatures(definition, **entry_kwargs) -> dict:
    """The norm + QKV + RoPE GEMV at the Definition's head width and dtype, with per-head
    norms where the Definition has their weights; with and without the static KV-cache write
    in its epilogue (``rope_gemv`` 2 in a model's decode step: the same kernel, which the
    Definition's outputs do not show)."""
    (d,) = const_axes(definition, "D")
    head_norm = "q_norm_weight" in definition.inputs
    offset = bool(entry_kwargs.get("unit_offset", False))
    out: dict = {}
    for cache_write in (False, True):
        sigs = gemm.norm_rope_signatures(
            d, (tensor_dtype(definition),), head_norm=head_norm, head_offset=offset,
            cache_write=cache_write,
        )  # fmt: skip
        for kernel, kernel_sigs in sigs.items():
            out.setdefault(kernel, []).extend(kernel_sigs)
    return out
