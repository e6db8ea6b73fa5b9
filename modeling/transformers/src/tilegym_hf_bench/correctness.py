"""Logits of the bf16 baseline and the kernelized model against an fp32 reference.

Each side's logits come from the very ``generate()`` call its timed runs make (same patched
model, same cache class, same kernels: prefill and every decode step). The fp32 reference runs
one full forward over that side's own generated sequence, so it scores the same positions the
side predicted (teacher-forced on that sequence). Compared: the logits of each generated token.
"""

from __future__ import annotations

import torch


@torch.inference_mode()
def full_logits(model, sequence: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """fp32 logits [B, N, V] predicting tokens prompt_len.. of ``sequence`` (one full forward)."""
    n = sequence.shape[1] - prompt_len
    out = model(input_ids=sequence[:, :-1], use_cache=False, logits_to_keep=n)
    return out.logits.float()


def rel_err(logits: torch.Tensor, reference: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(logits - reference) / torch.linalg.vector_norm(reference))


def top1_agreement(logits: torch.Tensor, reference: torch.Tensor) -> float:
    return float((logits.argmax(-1) == reference.argmax(-1)).float().mean())


def is_finite(logits: torch.Tensor) -> bool:
    return bool(torch.isfinite(logits).all())
