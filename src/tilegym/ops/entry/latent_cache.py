"""Entry point of the static-cache write of keys and values of two widths at a device position
(DeepSeek V2/V3's latent and rope key) over ``tilegym.ops.latent_cache``."""

from __future__ import annotations

import torch

from tilegym.ops import latent_cache as _ops
from tilegym.ops.entry import const_axes, tensor_dtype


def latent_cache_update(
    key_new: torch.Tensor,
    value_new: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
) -> None:
    """Write ``S`` new tokens at the start of the cache buffers (destination passing), the
    position and the length on the device as the decode step keeps them."""
    position = torch.zeros(1, dtype=torch.int32, device=key_new.device)
    length = torch.zeros((), dtype=torch.int64, device=key_new.device)
    _ops.latent_cache_write_at(key_new, value_new, key_cache, value_cache, position, length)


def aot_signatures(definition) -> dict:
    """The write kernel at the Definition's key width ``L`` and value width ``R`` (decode and
    prompt tiles)."""
    latent, rope = const_axes(definition, "L", "R")
    return _ops.aot_signatures(latent, rope, (tensor_dtype(definition),))
