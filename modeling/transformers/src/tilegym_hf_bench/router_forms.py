"""How each transformers MoE router ranks experts and weights a selection, so the referee can
read the scores its top-k compares and give a swapped selection the weights the router itself
would give it. Plain tensor functions of the router's logits (its first output) and its own
attributes; the forms are those of transformers 5.17 to 5.24 (the routers are the same there),
and ``routing`` checks each against the router's own output on every recorded forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RouterForm:
    #: the scores its top-k ranks (-inf, or 0 for DeepSeek-V2, where a group limit masks them)
    ranking: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]
    #: the same scores before any group mask: what bf16 rounding moves
    raw: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]
    #: the weights it gives the experts ``indices`` [T, k]
    weights: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


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


def _group_mask(router, group_scores):
    """[T, E] bool: the experts in the ``topk_group`` best groups."""
    idx = torch.topk(group_scores, k=router.topk_group, dim=-1, sorted=False)[1]
    groups = torch.zeros_like(group_scores).scatter(1, idx, 1.0).bool()
    per_group = router.num_experts // router.num_group
    return groups.repeat_interleave(per_group, dim=1)


def _v2_ranking(router, logits):
    scores = _softmax(router, logits)
    if router.topk_method != "group_limited_greedy":
        return scores
    grouped = scores.view(-1, router.num_group, router.num_experts // router.num_group)
    return scores.masked_fill(~_group_mask(router, grouped.max(dim=-1).values), 0.0)


def _v2_weights(router, logits, indices):
    return _v2_ranking(router, logits).gather(1, indices) * router.routed_scaling_factor


def _v3_raw(router, logits):
    return torch.sigmoid(logits.float()) + router.e_score_correction_bias.float()


def _v3_ranking(router, logits):
    choice = _v3_raw(router, logits)
    grouped = choice.view(-1, router.num_group, router.num_experts // router.num_group)
    top2 = grouped.topk(2, dim=-1)[0].sum(dim=-1)
    return choice.masked_fill(~_group_mask(router, top2), float("-inf"))


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
    "DeepseekV2TopkRouter": RouterForm(_v2_ranking, _softmax, _v2_weights),
    "DeepseekV3TopkRouter": RouterForm(_v3_ranking, _v3_raw, _v3_weights),
}


def form_of(module: torch.nn.Module) -> RouterForm | None:
    return FORMS.get(type(module).__name__)
