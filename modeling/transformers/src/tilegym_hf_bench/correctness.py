"""Teacher-forced logits of the bf16 baseline and the kernelized model against an fp32 reference.

The sequence is the prompt plus the baseline's greedy continuation. The bf16 models run it the
way generate() does (a prefill, then one cached decode step per token), so both the prefill and
the decode kernels are checked; the fp32 reference runs one full forward. Compared: the logits
that predict each generated token.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache


def _cache_kwarg(model, cache) -> dict:
    """Newer transformers 5.x name the KV cache argument ``cache``, 5.17 ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return {"cache" if "cache" in params else "past_key_values": cache}


def _new_cache(model):
    try:
        return DynamicCache(config=model.config)
    except TypeError:
        return DynamicCache()


@torch.inference_mode()
def stepwise_logits(model, sequence: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """fp32 logits [B, N, V] predicting tokens prompt_len.. of ``sequence``: prefill + decode."""
    cache = _cache_kwarg(model, _new_cache(model))
    out = model(input_ids=sequence[:, :prompt_len], use_cache=True, logits_to_keep=1, **cache)
    logits = [out.logits[:, -1].float()]
    for pos in range(prompt_len, sequence.shape[1] - 1):
        out = model(input_ids=sequence[:, pos : pos + 1], use_cache=True, **cache)
        logits.append(out.logits[:, -1].float())
    return torch.stack(logits, dim=1)


@torch.inference_mode()
def full_logits(model, sequence: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """fp32 logits [B, N, V] of one full forward, the same positions as ``stepwise_logits``."""
    n = sequence.shape[1] - prompt_len
    out = model(input_ids=sequence[:, :-1], use_cache=False, logits_to_keep=n)
    return out.logits.float()


def rel_err(logits: torch.Tensor, reference: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(logits - reference) / torch.linalg.vector_norm(reference))


def top1_agreement(logits: torch.Tensor, reference: torch.Tensor) -> float:
    return float((logits.argmax(-1) == reference.argmax(-1)).float().mean())


def is_finite(logits: torch.Tensor) -> bool:
    return bool(torch.isfinite(logits).all())
