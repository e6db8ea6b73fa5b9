"""Shared entry points of the causal depthwise conv1d + SiLU of a gated delta net layer (Qwen3.5,
Qwen3-Next) over ``tilegym.ops.causal_conv1d``: the prompt's, and a decode step's against the
cached inputs (shifted in place)."""

from __future__ import annotations

import torch

from tilegym.ops import causal_conv1d as _ops
from tilegym.ops.entry import const_axes, tensor_dtype


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu(conv1d(x))`` over a prompt ``[B, T, C]`` with zeros before it (weight ``[C, K]``)
    and the conv state a decode step continues from: the last ``K`` inputs ``[B, C, K]``."""
    state = x.new_empty((x.shape[0], x.shape[2], weight.shape[1]))
    return _ops.causal_conv1d(x, weight, None, None, state), state


def causal_conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor):
    """A decode step ``[B, 1, C]`` against ``conv_state`` ``[B, C, K]`` (the last K inputs),
    which is shifted in place: ``(out, conv_state)``."""
    return _ops.causal_conv1d_update(x, conv_state, weight), conv_state


def aot_signatures(definition) -> dict:
    """The conv kernel's prefill and decode forms at the Definition's channels ``C`` and
    kernel width ``K``."""
    channels, width = const_axes(definition, "C", "K")
    return _ops.aot_signatures(
        channels=(channels,), dtypes=(tensor_dtype(definition),), kernel_size=width
    )
