"""Entry points of multi-head latent attention (DeepSeek V2/V3) over ``tilegym.ops.mla``.

The model reaches these kernels through its family's attention forward
(``tilegym.transformers.deepseek_v2``); the Solutions name the functions here at a family's
widths (the Definition's ``H``, ``L``, ``R``, ``N``, ``V``) and softmax scale (``entry_kwargs``:
the module's ``scaling``, YaRN's mscale included).
"""

from __future__ import annotations

import torch

from tilegym.ops import mla as _ops
from tilegym.ops.entry import const_axes


def mla_decode(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    ckv: torch.Tensor,
    kpe: torch.Tensor,
    *,
    scale: float,
) -> torch.Tensor:
    """One new token per sequence over the whole latent cache: the absorbed query ``[B, H, L]``
    and its rope part ``[B, H, R]`` against the latent ``[B, 1, T, L]`` and rope keys
    ``[B, 1, T, R]``; returns the latent context ``[B, H, L]``."""
    return _ops.mla_decode(q_latent, q_pe, ckv, kpe, scale=scale)


def mla_prefill(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    k_nope: torch.Tensor,
    k_pe: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
) -> torch.Tensor:
    """Causal attention of a prompt (the last ``S`` of ``T`` keys) with keys ``[k_nope_h,
    k_pe]`` (the rope key shared by the heads) and values ``v``: ``[B, S, H, V]``."""
    return _ops.mla_prefill(q_nope, q_pe, k_nope, k_pe, v, scale=scale)


def aot_signatures(definition, *, scale: float | None = None) -> dict:
    """The latent decode kernel and its split reduction (a Definition with the latent width
    ``L``), or the prefill kernel (one with ``N`` and ``V``), at the Definition's widths."""
    if "L" in definition.axes:
        latent, rope = const_axes(definition, "L", "R")
        sigs = _ops.aot_signatures(latent=latent, rope=rope)
        return {k: v for k, v in sigs.items() if k is not _ops.mla_prefill_kernel}
    heads, nope, rope, v_dim = const_axes(definition, "H", "N", "R", "V")
    return {_ops.mla_prefill_kernel: _ops.mla_prefill_signatures(heads, nope, rope, v_dim)}
