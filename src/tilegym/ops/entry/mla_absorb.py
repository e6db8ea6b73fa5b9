"""Entry points of the absorbed MLA decode's per-head products (DeepSeek V2/V3) over
``tilegym.ops.mla_absorb``.

The model reaches these kernels through its family's attention forward
(``tilegym.transformers.mla``), on views of ``kv_b_proj``'s weight; the Solutions name the
functions here with the weight as stored (``[H * (N + V), L]``), which they view the same way
(``tilegym.ops.mla.split_kv_b_weight``): the query's nope part through ``W_UK`` into the latent
space, and the latent context through ``W_UV`` into the heads' values.
"""

from __future__ import annotations

import torch

from tilegym.ops import mla_absorb as _ops
from tilegym.ops.entry import tensor_dtype
from tilegym.ops.mla import split_kv_b_weight


def absorb_query(q_nope: torch.Tensor, kv_b_weight: torch.Tensor) -> torch.Tensor:
    """``q_nope`` ``[B, H, N]`` through each head's ``W_UK`` (the first ``N`` of its ``N + V``
    rows of ``kv_b_weight``): ``[B, H, L]``."""
    h, n = q_nope.shape[1], q_nope.shape[2]
    w_uk, _ = split_kv_b_weight(kv_b_weight, h, n, kv_b_weight.shape[0] // h - n)
    return _ops.absorb_query(q_nope, w_uk)


def latent_to_heads(ctx: torch.Tensor, kv_b_weight: torch.Tensor, *, v_dim: int) -> torch.Tensor:
    """``ctx`` ``[B, H, L]`` through each head's ``W_UV`` (the last ``v_dim`` of its rows of
    ``kv_b_weight``): ``[B, H, V]``."""
    h = ctx.shape[1]
    _, w_uv = split_kv_b_weight(kv_b_weight, h, kv_b_weight.shape[0] // h - v_dim, v_dim)
    return _ops.latent_to_heads(ctx, w_uv)


def aot_signatures(definition, *, v_dim: int | None = None) -> dict:
    """Both products' kernel at every batch tile in the Definition's dtype (the widths are
    run-time array shapes)."""
    return _ops.aot_signatures((tensor_dtype(definition),))
