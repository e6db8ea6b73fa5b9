"""gemma3 sandwich-norm entry points over ``tilegym.ops.rms_norm.rms_norm_add``.

Gemma 3 normalizes each sub-block's output before adding it to the residual; after attention
the sum is normalized again as the MLP's input. Each is one pass over the rows: the output
norm, the add and (after attention) the next norm.
"""

from __future__ import annotations

import torch

from tilegym.ops import rms_norm as _ops

HIDDEN = 1152
EPS = 1e-6


def post_attention_norm_add(
    attn_output: torch.Tensor,
    residual: torch.Tensor,
    post_weight: torch.Tensor,
    pre_weight: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(``residual + post_attention_layernorm(attn_output)``, ``pre_feedforward_layernorm`` of
    that sum)."""
    return _ops.rms_norm_add(attn_output, residual, post_weight, EPS, pre_weight, unit_offset=True)


def post_feedforward_norm_add(
    mlp_output: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    """``residual + post_feedforward_layernorm(mlp_output)``."""
    return _ops.rms_norm_add(mlp_output, residual, weight, EPS, unit_offset=True)[0]


def aot_signatures() -> dict:
    """The norm-add kernel with and without the next norm (bf16, Gemma's form)."""
    return _ops.aot_signatures(
        hidden_sizes=(HIDDEN,), dtypes=(torch.bfloat16,), unit_offsets=(True,), ops=("norm_add",)
    )
