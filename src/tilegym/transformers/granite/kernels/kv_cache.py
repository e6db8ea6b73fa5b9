"""Granite KV-cache entry point: the cuTile write of new keys/values into a preallocated cache."""

from __future__ import annotations

import torch

from tilegym.ops import kv_cache as _ops

NUM_KV_HEADS = 8
HEAD_DIM = 64


def granite_kv_cache_update(
    key_new: torch.Tensor,
    value_new: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
) -> None:
    """Write ``S`` new tokens at the start of the cache buffers (destination passing)."""
    _ops.kv_cache_write(key_new, value_new, key_cache, value_cache, 0)


def aot_signatures():
    """The cache write kernel for one-token (decode) and 64-token (prefill) tiles."""
    return _ops.aot_signatures(HEAD_DIM)
