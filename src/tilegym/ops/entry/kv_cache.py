"""Shared KV-cache entry point: the cuTile write of new keys/values into a preallocated cache."""

from __future__ import annotations

import torch

from tilegym.ops import kv_cache as _ops
from tilegym.ops.entry import const_axes


def kv_cache_update(
    key_new: torch.Tensor,
    value_new: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
) -> None:
    """Write ``S`` new tokens at the start of the cache buffers (destination passing)."""
    _ops.kv_cache_write(key_new, value_new, key_cache, value_cache, 0)


def aot_signatures(definition) -> dict:
    """The cache write kernel at the Definition's head dim ``D`` (decode and prefill tiles)."""
    (head_dim,) = const_axes(definition, "D")
    return _ops.aot_signatures(head_dim)
