"""Shared per-head q/k RMSNorm + transpose + RoPE entry point over ``tilegym.ops.rope``."""

from __future__ import annotations

from tilegym.ops import rope as _ops
from tilegym.ops.entry import const_axes, tensor_dtype


def qk_norm_rope(
    q,
    k,
    q_weight,
    k_weight,
    cos,
    sin,
    *,
    eps: float,
    unit_offset: bool = False,
    decode_heads: int = 0,
):
    """``[B, S, H, D]`` projections -> normed, rotated ``[B, H, S, D]`` q and k (``unit_offset``:
    Gemma's ``1 + weight`` norms; ``decode_heads``: a model's ``rope_heads`` tuning, decode
    calls on the head-loop kernel with that many heads a block)."""
    return _ops.qk_norm_rope(
        q, k, q_weight, k_weight, eps, cos, sin, unit_offset=unit_offset, decode_heads=decode_heads
    )


def aot_signatures(
    definition, *, eps: float | None = None, unit_offset: bool = False, decode_heads: int = 0
) -> dict:
    """The fused kernels the default dispatch launches at the Definition's (``HQ``, ``HK``,
    ``D``) head layout, dtype and norm form, with the tuned decode launches of
    ``decode_heads``."""
    heads = const_axes(definition, "HQ", "HK", "D")
    return _ops.aot_signatures(
        heads=(heads,),
        dtypes=(tensor_dtype(definition),),
        partial_rot=(),
        ops=("qk",),
        unit_offsets=(unit_offset,),
        decode_heads=(decode_heads,) if decode_heads else (),
    )
