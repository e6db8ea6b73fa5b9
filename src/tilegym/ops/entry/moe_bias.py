"""Entry points of biased experts with the clamped gated activation (gpt-oss) over
``tilegym.ops.moe_bias``: the experts' two grouped GEMMs, each with its bias, split at the
per-slot activation ``[T, k, I]`` as ``tilegym.ops.entry.moe``'s are (same dispatch).

The weights are in the kernels' row layout (``tilegym.ops.moe_bias.expert_rows``: gate rows then
up rows ``[E, 2I, H]``, ``[E, H, I]``), which the model glue builds once from gpt-oss's
interleaved, transposed parameters. The clamp's ``alpha`` and ``limit`` are keyword-only
parameters (``spec.entry_kwargs``); the sizes are the Definition's const axes.
"""

from __future__ import annotations

import torch

from tilegym.ops import moe_bias as _ops
from tilegym.ops.entry import const_axes, tensor_dtype
from tilegym.ops.entry.moe import _dispatch


def experts_gate_up_clamped(
    hidden: torch.Tensor,
    ids: torch.Tensor,
    gate_up_weight: torch.Tensor,
    gate_up_bias: torch.Tensor,
    *,
    alpha: float,
    limit: float,
) -> torch.Tensor:
    """``a = min(g, limit) * sigmoid(alpha * min(g, limit)) * (clamp(u, +-limit) + 1)`` with
    ``[g; u] = gate_up[e] @ x_t + gate_up_bias[e]`` for every (token t, slot j), ``e = ids[t, j]``:
    ``[T, H]``, ``[T, k]``, ``[E, 2I, H]``, ``[E, 2I]`` -> ``[T, k, I]``."""
    t, k = ids.shape
    n_experts, i2, _ = gate_up_weight.shape
    cfg, sorted_, pos, bexp = _dispatch(ids, n_experts)
    act = hidden.new_empty((sorted_.numel(), i2 // 2))
    _ops.grouped_gate_up_bias(
        hidden.contiguous(),
        sorted_,
        bexp,
        gate_up_weight,
        gate_up_bias,
        k,
        cfg,
        act,
        alpha=alpha,
        limit=limit,
        act=_ops.ACT_CLAMPED,
    )
    return act[pos.long()].view(t, k, i2 // 2)


def experts_down_bias_combine(
    act: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    down_weight: torch.Tensor,
    down_bias: torch.Tensor,
    residual: torch.Tensor,
) -> torch.Tensor:
    """``residual_t + sum_j weights[t, j] * (down[e] @ act[t, j] + down_bias[e])`` (sum in
    fp32): ``[T, k, I]``, ``[E, H, I]``, ``[E, H]`` -> ``[T, H]``."""
    t, k, inter = act.shape
    n_experts, hidden, _ = down_weight.shape
    cfg, sorted_, pos, bexp = _dispatch(ids, n_experts)
    out = torch.empty_like(residual, memory_format=torch.contiguous_format)
    rows = act.new_zeros((sorted_.numel(), inter))
    rows[pos.long()] = act.reshape(t * k, inter)
    y = act.new_empty((rows.shape[0], hidden))
    _ops.grouped_down_bias(rows, bexp, down_weight, down_bias, cfg, y)
    return _ops._moe.combine(y, pos.view(t, k), weights, residual, out)


def aot_signatures(definition, *, alpha: float | None = None, limit: float | None = None) -> dict:
    """Both biased grouped GEMMs (and the shared dispatch, gather and combine kernels) at the
    Definition's experts ``E``, experts per token ``K`` and hidden size ``H`` in its dtype."""
    experts, k, hidden = const_axes(definition, "E", "K", "H")
    return _ops.aot_signatures(experts, k, hidden, dtypes=(tensor_dtype(definition),))
