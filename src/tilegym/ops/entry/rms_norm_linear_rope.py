"""Shared entry points of a QKV projection with RoPE in its epilogue over
``tilegym.ops.gemm.rms_norm_linear_rope``: a pre-norm layer's input RMSNorm, QKV projection
and RoPE, with per-head q/k norms before it where the Definition has their weights
(Definitions ``[T, H]``, ``[H]``, ``[NQKV, H]``, ``[T, D]``, ``[T, D]``, then ``[D]``, ``[D]``
for the head norms; axes ``HQ``, ``HK``, ``D``), and a post-norm layer's QKV projection with
OLMo's whole-projection q/k norms and RoPE (no input norm; ``[T, H]``, ``[NQKV, H]``, ``[T,
D]``, ``[T, D]``, ``[NQ]``, ``[NK]``)."""

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


def linear_qk_norm_whole_rope(
    hidden_states: torch.Tensor,
    qkv_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_norm_weight: torch.Tensor,
    k_norm_weight: torch.Tensor,
    *,
    rotated_heads: int,
    q_heads: int,
    head_eps: float,
    round_once: bool = True,
) -> torch.Tensor:
    """``linear(x, W_qkv)`` with q's heads RMS-normed together over the whole q projection
    (``q_norm_weight``: ``[q_heads * D]``), k's over k's, and RoPE on both: OLMo 2/3's
    post-norm QKV projection, q_norm / k_norm and RoPE in one launch."""
    heads = gemm.HeadNorms(
        q_norm_weight, k_norm_weight, head_eps, q_heads, whole=True, round_once=round_once
    )
    return gemm.rms_norm_linear_rope(
        hidden_states, None, 0.0, qkv_weight, None, cos, sin, rotated_heads, head_norms=heads
    )


def aot_signatures(definition, **entry_kwargs) -> dict:
    """The QKV + RoPE GEMV at the Definition's head width and dtypes: with the input norm where
    the Definition has its weight, with per-head norms where it has ``[D]`` q/k norm weights
    (whole-projection ones where they are wider); with and without the static KV-cache write
    in its epilogue (``rope_gemv`` 2 in a model's decode step: the same kernel, which the
    Definition's outputs do not show)."""
    (d,) = const_axes(definition, "D")
    q_norm = definition.inputs.get("q_norm_weight")
    head_norm = q_norm is not None
    whole = head_norm and list(q_norm.shape) != ["D"]
    cos_dtype = getattr(torch, definition.inputs["cos"].dtype)
    offset = bool(entry_kwargs.get("unit_offset", False))
    out: dict = {}
    for cache_write in (False, True):
        sigs = gemm.norm_rope_signatures(
            d, (tensor_dtype(definition),), cos_dtype, head_norm=head_norm, head_offset=offset,
            cache_write=cache_write, norm="norm_weight" in definition.inputs, whole=whole,
        )  # fmt: skip
        for kernel, kernel_sigs in sigs.items():
            out.setdefault(kernel, []).extend(kernel_sigs)
    return out
