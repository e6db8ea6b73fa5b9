"""Shared entry point of the recurrent gated delta rule (decode of a gated delta net layer:
Qwen3.5, Qwen3-Next) over ``tilegym.ops.gated_delta``."""

from __future__ import annotations

from tilegym.ops import gated_delta as _ops
from tilegym.ops.entry import const_axes, tensor_dtype


def gated_delta_recurrent(q, k, v, a, b, A_log, dt_bias, state):
    """One decode step (T = 1) from the cached fp32 ``state`` ``[B, HV, DK, DV]``, which is
    updated in place (a CUDA graph replays it at one address): ``(out [B, 1, HV, DV], state)``."""
    return _ops.gated_delta_recurrent(q, k, v, a, b, A_log, dt_bias, state), state


def aot_signatures(definition) -> dict:
    """The decode kernel at the Definition's (``HK``, ``HV``, ``DK``, ``DV``) and dtype."""
    heads = const_axes(definition, "HK", "HV", "DK", "DV")
    sigs = _ops.aot_signatures(heads=(heads,), dtypes=(tensor_dtype(definition),))
    return {_ops.gdn_recurrent_kernel: sigs[_ops.gdn_recurrent_kernel]}
