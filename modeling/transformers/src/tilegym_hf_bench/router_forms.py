"""How each transformers MoE router ranks experts (and, for DeepSeek's, the groups it keeps) and
weights a selection, so the referee can read the scores its top-k compares and give a swapped
selection the weights the router itself would give it. Plain tensor functions of the router's
logits (its first output) and its own attributes; the forms are those of transformers 5.17 to
5.24 (the routers are the same there), and ``routing`` checks each against the router's own
output on every recorded forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GroupLimit:
    """A router that keeps its best ``topk_group`` of ``num_group`` expert groups before its
    top-k: bf16 can keep another group where two group scores are near-tied, and the token's
    experts then change without any near-tie among the experts it could still choose."""

    #: [T, G] the scores its group top-k ranks, from the router's logits
    scores: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]
    #: [T, E] the expert ranking with only the groups ``kept`` ([T, G] bool) open
    within: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
    #: how far an error of at most e on every raw score moves a group score (a sum of the
    #: group's two best: 2e; its best: e)
    lipschitz: float
    #: whether this router instance limits groups at all (it may keep every group)
    limits: Callable[[torch.nn.Module], bool]


@dataclass(frozen=True)
class RouterForm:
    #: the scores its top-k ranks (-inf, or 0 for DeepSeek-V2, where a group limit masks them)
    ranking: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]
    #: the same scores before any group mask: what bf16 rounding moves
    raw: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]
    #: the weights it gives the experts ``indices`` [T, k]
    weights: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
    group: GroupLimit | None = None

    def limits_groups(self, router: torch.nn.Module) -> bool:
        return self.group is not None and self.group.limits(router)


def _softmax(router, logits):
    return torch.softmax(logits.float(), dim=-1)


def _renormalized(w):
    return w / w.sum(dim=-1, keepdim=True)


def _mixtral_weights(router, logits, indices):
    return _renormalized(_softmax(router, logits).gather(1, indices))


def _qwen_weights(router, logits, indices):
    """Olmoe, Qwen3-MoE and Qwen3-Next: softmax probabilities, renormalized if configured."""
    w = _softmax(router, logits).gather(1, indices)
    return _renormalized(w) if router.norm_topk_prob else w


def _gpt_oss_raw(router, logits):
    return logits.float()


def _gpt_oss_weights(router, logits, indices):
    """A softmax over the chosen logits only."""
    return torch.softmax(logits.float().gather(1, indices), dim=1)


def kept_groups(router, group_scores):
    """[T, G] bool: the ``topk_group`` best groups."""
    idx = torch.topk(group_scores, k=router.topk_group, dim=-1, sorted=False)[1]
    return torch.zeros_like(group_scores, dtype=torch.bool).scatter(1, idx, True)


def _experts_of(router, kept):
    """[T, G] bool groups to [T, E] bool experts."""
    return kept.repeat_interleave(router.num_experts // router.num_group, dim=1)


def _grouped(router, scores):
    return scores.view(-1, router.num_group, router.num_experts // router.num_group)


def _v2_groups(router, logits):
    return _grouped(router, _softmax(router, logits)).max(dim=-1).values


def _v2_within(router, logits, kept):
    return _softmax(router, logits).masked_fill(~_experts_of(router, kept), 0.0)


def _v2_limits(router):
    return router.topk_method == "group_limited_greedy" and router.topk_group < router.num_group


def _v2_ranking(router, logits):
    if not _v2_limits(router):
        return _softmax(router, logits)
    return _v2_within(router, logits, kept_groups(router, _v2_groups(router, logits)))


def _v2_weights(router, logits, indices):
    """The chosen experts' softmax scores, scaled: unmasked, so a selection in other groups
    than the router kept (a swapped group tie) is weighted as the router would weight it."""
    return _softmax(router, logits).gather(1, indices) * router.routed_scaling_factor


def _v3_raw(router, logits):
    return torch.sigmoid(logits.float()) + router.e_score_correction_bias.float()


def _v3_groups(router, logits):
    return _grouped(router, _v3_raw(router, logits)).topk(2, dim=-1)[0].sum(dim=-1)


def _v3_within(router, logits, kept):
    return _v3_raw(router, logits).masked_fill(~_experts_of(router, kept), float("-inf"))


def _v3_ranking(router, logits):
    return _v3_within(router, logits, kept_groups(router, _v3_groups(router, logits)))


def _v3_weights(router, logits, indices):
    w = torch.sigmoid(logits.float()).gather(1, indices)
    if router.norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * router.routed_scaling_factor


_QWEN = RouterForm(_softmax, _softmax, _qwen_weights)

#: by the router's class name
FORMS: dict[str, RouterForm] = {
    "MixtralTopKRouter": RouterForm(_softmax, _softmax, _mixtral_weights),
    "OlmoeTopKRouter": _QWEN,
    "Qwen3MoeTopKRouter": _QWEN,
    "Qwen3NextTopKRouter": _QWEN,
    "GptOssTopKRouter": RouterForm(_gpt_oss_raw, _gpt_oss_raw, _gpt_oss_weights),
    "DeepseekV2TopkRouter": RouterForm(
        _v2_ranking, _softmax, _v2_weights, GroupLimit(_v2_groups, _v2_within, 1.0, _v2_limits)
    ),
    "DeepseekV3TopkRouter": RouterForm(
        _v3_ranking,
        _v3_raw,
        _v3_weights,
        GroupLimit(
            _v3_groups, _v3_within, 2.0, lambda router: router.topk_group < router.num_group
        ),
    ),
}


def form_of(module: torch.nn.Module) -> RouterForm | None:
    return FORMS.get(type(module).__name__)
