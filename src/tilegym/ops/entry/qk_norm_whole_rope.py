"""Shared whole-projection q/k RMSNorm + per-head view + transpose + RoPE entry point (OLMo 2,
OLMo 3, OLMoE) over ``tilegym.ops.qk_norm_whole_rope``."""

from __future__ import annotations

import torch

from tilegym.ops import qk_norm_whole_rope as _ops
from tilegym.ops.entry import const_axes, tensor_dtype


def qk_norm_whole_rope(q, k, q_weight, k_weight, cos, sin, *, eps: float, round_once: bool):
    """``[B, S, H, D]`` projections, ``[H * D]`` norm weights -> normed, rotated ``[B, H, S, D]``
    q and k (``round_once``: Olmo2RMSNorm's rounding, else OlmoeRMSNorm's)."""
    return _ops.qk_norm_whole_rope(q, k, q_weight, k_weight, eps, cos, sin, round_once=round_once)


def aot_signatures(definition, *, eps: float | None = None, round_once: bool) -> dict:
    """The kernel's launches at the Definition's (``HQ``, ``HK``, ``D``) layout, activation
    dtype, table dtype (its ``cos`` input: fp32 for OLMo 2/3) and norm form."""
    heads = const_axes(definition, "HQ", "HK", "D")
    cos_dtype = getattr(torch, definition.inputs["cos"].dtype)
    return _ops.aot_signatures(
        heads=(heads,),
        dtypes=(tensor_dtype(definition),),
        cos_dtypes=(cos_dtype,),
        round_once=(bool(round_once),),
    )
