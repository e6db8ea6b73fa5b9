"""Shared mixture-of-experts entry points over ``tilegym.ops.moe`` (Qwen3-MoE, OLMoE, Mixtral):
the router after its linear, and the experts' two grouped GEMMs.

The model calls ``moe_route`` and ``moe_experts`` (``tilegym.transformers.moe_block``). The
experts op runs in stages: a dispatch laying the (token, slot) pairs out in padded row blocks
of one expert each (grouped by expert; one pair per block at decode), a gather of the blocks'
hidden rows, a grouped gate/up GEMM with SiLU-and-mul, a grouped down GEMM, and a combine that
weights each token's rows, sums them in fp32 and adds the residual. The two experts entry points
below run those kernels up to, and from, the per-slot activation ``[T, k, I]`` (taken out of and
put back into the kernels' expert-sorted rows by the dispatch's row map), so that each grouped
GEMM has its own Definition. A family's experts-per-token and renormalization are the router's
keyword-only parameters (``spec.entry_kwargs``); the sizes are the Definition's const axes.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from tilegym.ops import moe as _ops
from tilegym.ops.entry import const_axes, tensor_dtype


def router(router_logits: torch.Tensor, *, top_k: int, normalize: bool):
    """(routing weights ``[T, top_k]`` in the logits dtype, expert ids ``[T, top_k]`` int32),
    best first: fp32 softmax over the experts, the ``top_k`` largest, renormalized over them
    when ``normalize`` (Qwen3-MoE's and Mixtral's routers; OLMoE-1B-7B's is not)."""
    return _ops.moe_route(router_logits, top_k, normalize)


def _dispatch(ids: torch.Tensor, n_experts: int):
    """(config, sorted slot per padded row, padded row per slot, expert per block). The
    ``direct`` dispatch the op takes at decode has no dispatch kernel (its GEMMs read the ids);
    its rows are the ``per_slot`` layout, which the dispatch kernel writes for these entry
    points."""
    t, k = ids.shape
    cfg = _ops.choose_config(t * k, n_experts)
    if cfg.dispatch == "direct":
        cfg = replace(cfg, dispatch="per_slot")
    flat = ids.reshape(-1).to(torch.int32).contiguous()
    return (cfg, *_ops.moe_dispatch(flat, n_experts, cfg.bm, cfg.dispatch))


def experts_gate_up_silu(
    hidden: torch.Tensor, ids: torch.Tensor, gate_up_weight: torch.Tensor
) -> torch.Tensor:
    """``silu(x_t @ Wg[e]^T) * (x_t @ Wu[e]^T)`` for every (token t, slot j), ``e = ids[t, j]``:
    ``[T, H]`` hidden, ``[T, k]`` ids, ``[E, 2I, H]`` packed [gate; up] weights -> ``[T, k, I]``."""
    t, k = ids.shape
    n_experts, i2, _ = gate_up_weight.shape
    cfg, sorted_, pos, bexp = _dispatch(ids, n_experts)
    act = hidden.new_empty((sorted_.numel(), i2 // 2))
    _ops.grouped_gate_up_silu(hidden.contiguous(), sorted_, bexp, gate_up_weight, k, cfg, act)
    return act[pos.long()].view(t, k, i2 // 2)


def experts_down_combine(
    act: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    down_weight: torch.Tensor,
    residual: torch.Tensor,
) -> torch.Tensor:
    """``residual_t + sum_j weights[t, j] * act[t, j] @ Wd[e]^T`` (``e = ids[t, j]``, sum in
    fp32): ``[T, k, I]`` activations, ``[E, H, I]`` down weights -> ``[T, H]``."""
    t, k, inter = act.shape
    n_experts, hidden, _ = down_weight.shape
    cfg, sorted_, pos, bexp = _dispatch(ids, n_experts)
    out = torch.empty_like(residual, memory_format=torch.contiguous_format)
    rows = act.new_zeros((sorted_.numel(), inter))
    rows[pos.long()] = act.reshape(t * k, inter)
    y = _ops.grouped_down(rows, bexp, down_weight, cfg, act.new_empty((rows.shape[0], hidden)))
    return _ops.combine(y, pos.view(t, k), weights, residual, out)


def aot_signatures(definition, *, top_k: int | None = None, normalize: bool | None = None) -> dict:
    """Every MoE kernel at the Definition's experts ``E``, experts per token ``K`` and hidden
    size ``H`` in its dtype: dispatch, both grouped GEMMs at the decode and prefill tiles,
    combine (and the router); a Definition without ``H`` (the router's) gets the router kernel
    alone."""
    experts, k = const_axes(definition, "E", "K")
    dtypes = (tensor_dtype(definition),)
    if "H" not in definition.axes:  # the router: its kernel alone
        sigs = _ops.aot_signatures(experts=experts, top_k=k, dtypes=dtypes)
        return {_ops.tilegym_moe_route_kernel: sigs[_ops.tilegym_moe_route_kernel]}
    (hidden,) = const_axes(definition, "H")
    return _ops.aot_signatures(experts=experts, top_k=k, hidden=hidden, dtypes=dtypes)
