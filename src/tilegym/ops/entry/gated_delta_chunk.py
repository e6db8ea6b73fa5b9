"""Shared entry point of the chunked gated delta rule (prefill of a gated delta net layer: Qwen3.5,
Qwen3-Next) over ``tilegym.ops.gated_delta``."""

from __future__ import annotations

import torch

from tilegym.ops import gated_delta as _ops
from tilegym.ops.entry import const_axes, tensor_dtype


def gated_delta_chunk(q, k, v, a, b, A_log, dt_bias) -> tuple[torch.Tensor, torch.Tensor]:
    """From the conv output's q, k ``[B, T, HK, DK]``, v ``[B, T, HV, DV]`` and the raw gate
    projections a, b ``[B, T, HV]``: ``(out [B, T, HV, DV], final fp32 state [B, HV, DK, DV])``,
    chunks of 64 from a zero state (a prompt)."""
    return _ops.gated_delta_chunk(q, k, v, a, b, A_log, dt_bias)


def aot_signatures(definition) -> dict:
    """The prep and scan kernels (the default scan form's) at the Definition's (``HK``, ``HV``,
    ``DK``, ``DV``) and dtype."""
    heads = const_axes(definition, "HK", "HV", "DK", "DV")
    sigs = _ops.aot_signatures(heads=(heads,), dtypes=(tensor_dtype(definition),))
    return {kernel: ss for kernel, ss in sigs.items() if kernel is not _ops.gdn_recurrent_kernel}
