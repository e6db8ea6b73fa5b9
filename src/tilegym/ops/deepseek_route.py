"""DeepSeek V2/V3 routers after their linear, as pure PyTorch functions on fp32 logits.

- V2 (``DeepseekV2TopkRouter``): softmax over the experts; ``greedy`` takes the top-k scores,
  ``group_limited_greedy`` first keeps the ``topk_group`` groups (of ``n_group`` equal groups)
  with the largest best score; the k scores times ``routed_scaling_factor`` (no
  renormalization).
- V3 (``DeepseekV3TopkRouter``): sigmoid scores; the choice adds ``e_score_correction_bias``;
  a group's score is the sum of its two best biased scores; the ``topk_group`` best groups are
  kept, the k best biased scores among them chosen; the weights are the unbiased scores,
  divided by their sum (+ 1e-20) when ``norm_topk_prob``, times ``routed_scaling_factor``.

Ties (equal scores or group scores at the cut) go to the lower index, deterministically;
upstream's ``torch.topk(sorted=False)`` leaves that to the implementation. Ids come best
first as int32 (the MoE expert kernels' form), weights in fp32 as upstream keeps them.
"""

from __future__ import annotations

import torch

V2_METHODS = ("greedy", "group_limited_greedy")


class RouteInputError(ValueError):
    """A router configuration or input these functions do not take."""


def top_indices(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest entries of each row, best first, ties to the lower index
    (a stable descending sort keeps equal entries in index order)."""
    return torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]


def group_mask(choice: torch.Tensor, n_group: int, topk_group: int, group_top: int) -> torch.Tensor:
    """Boolean ``[T, E]``: the experts of each token's ``topk_group`` best groups, a group
    scored by the sum of its ``group_top`` best entries (V2: 1, the max; V3: 2)."""
    t, e = choice.shape
    if n_group < 1 or e % n_group or not 1 <= topk_group <= n_group:
        raise RouteInputError(
            f"error: {e} experts in {n_group} groups keeping {topk_group}: need equal groups "
            "and 1 <= topk_group <= n_group"
        )
    per = e // n_group
    if not 1 <= group_top <= per:
        raise RouteInputError(f"error: group score of the top {group_top} of {per} experts")
    groups = choice.view(t, n_group, per)
    scores = torch.sort(groups, dim=-1, descending=True).values[..., :group_top].sum(-1)
    keep = torch.zeros((t, n_group), dtype=torch.bool, device=choice.device)
    keep.scatter_(1, top_indices(scores, topk_group), True)
    return keep[:, :, None].expand(t, n_group, per).reshape(t, e)


def _check(logits: torch.Tensor, top_k: int) -> None:
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise RouteInputError(
            f"error: router logits must be fp32 [T, E], got {logits.dtype} {tuple(logits.shape)}"
        )
    if not 1 <= top_k <= logits.shape[1]:
        raise RouteInputError(f"error: top_k={top_k} outside [1, {logits.shape[1]}]")


def deepseek_v2_route(
    logits: torch.Tensor,
    *,
    top_k: int,
    method: str = "greedy",
    n_group: int | None = None,
    topk_group: int | None = None,
    scaling: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights ``[T, k]`` fp32, ids ``[T, k]`` int32) of DeepSeek-V2's router."""
    _check(logits, top_k)
    if method not in V2_METHODS:
        raise RouteInputError(f"error: topk_method {method!r} not one of {V2_METHODS}")
    scores = logits.softmax(dim=-1, dtype=torch.float32)
    choice = scores
    if method == "group_limited_greedy":
        ok = group_mask(scores, int(n_group or 0), int(topk_group or 0), 1)
        choice = scores.masked_fill(~ok, float("-inf"))
    ids = top_indices(choice, top_k)
    return scores.gather(1, ids) * scaling, ids.to(torch.int32)


def deepseek_v3_route(
    logits: torch.Tensor,
    bias: torch.Tensor,
    *,
    top_k: int,
    n_group: int,
    topk_group: int,
    renormalize: bool,
    scaling: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights ``[T, k]`` fp32, ids ``[T, k]`` int32) of DeepSeek-V3's router
    (``bias``: ``e_score_correction_bias`` ``[E]``)."""
    _check(logits, top_k)
    if bias.shape != (logits.shape[1],):
        raise RouteInputError(
            f"error: e_score_correction_bias {tuple(bias.shape)} for {logits.shape[1]} experts"
        )
    scores = logits.sigmoid()
    choice = scores + bias.float()
    ok = group_mask(choice, int(n_group), int(topk_group), 2)
    ids = top_indices(choice.masked_fill(~ok, float("-inf")), top_k)
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scaling, ids.to(torch.int32)


def dense_weights(weights: torch.Tensor, ids: torch.Tensor, n_experts: int) -> torch.Tensor:
    """``[T, E]`` with each token's routing weight at its experts (0 elsewhere): the routing as
    the experts see it, whatever order the ids come in."""
    out = torch.zeros((ids.shape[0], n_experts), dtype=weights.dtype, device=weights.device)
    return out.scatter_add_(1, ids.long(), weights)
