"""How the shared attention forward writes new keys and values into a transformers cache.

A static cache under a tilegym mask is written by one cuTile launch at the mask's device
position (a compiled decode step holds no host value that changes per step); a sliding-window
static layer is kept as a ring buffer; any other cache goes through its own ``update``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer

from tilegym.ops.library import kv_cache_ring_write, kv_cache_write_at
from tilegym.transformers.attention import TileMask, device_position


def update_cache(cache, layer_idx, k, v, mask, takes_kwargs, kwargs):
    """Write the new keys/values into the cache and return what attention reads.

    A transformers ``StaticLayer`` under a tilegym mask with a device position (a static cache)
    is written by one cuTile launch at that position, which also advances the layer's length:
    no host value changes from one decode step to the next, so one compiled CUDA graph serves
    them all. A ``StaticSlidingWindowLayer`` under a tilegym mask is a ring buffer
    (``_update_sliding``). Any other cache goes through its own ``update``."""
    position = device_position(mask)
    layer = _layer(cache, layer_idx)
    if position is not None and type(layer) is StaticLayer:
        if not layer.is_initialized:
            layer.lazy_initialization(k, v)
        kv_cache_write_at(k, v, layer.keys, layer.values, position, layer.cumulative_length)
        return layer.keys, layer.values
    if isinstance(mask, TileMask) and type(layer) is StaticSlidingWindowLayer:
        return _update_sliding(
            layer, position, k, v, lambda: _update(cache, layer_idx, k, v, takes_kwargs, kwargs)
        )
    return _update(cache, layer_idx, k, v, takes_kwargs, kwargs)


def static_write_target(cache, layer_idx, mask, dtype: torch.dtype):
    """``(layer, position)`` where `update_cache` would write this step's keys and values, made
    in ``dtype``, with one device-position launch into an allocated ``StaticLayer`` of that
    dtype (a kernel that produces them may write them there itself, `gemm.CacheWrite`); None
    for every other cache or step, and for a cache in another dtype (its own write casts)."""
    position = device_position(mask)
    layer = _layer(cache, layer_idx)
    if position is None or type(layer) is not StaticLayer or not layer.is_initialized:
        return None
    if layer.keys.dtype != dtype or layer.values.dtype != dtype:
        return None
    return layer, position


def _layer(cache, layer_idx):
    layers = getattr(cache, "layers", None)
    return layers[layer_idx] if layers is not None else None


def _update(cache, layer_idx, k, v, takes_kwargs=False, kwargs=None):
    if takes_kwargs:
        return cache.update(k, v, layer_idx, kwargs=kwargs)
    return cache.update(k, v, layer_idx)


def _update_sliding(layer, position, k, v, update: Callable):
    """A static cache's sliding-window layer kept as a ring buffer: slot ``t % window`` holds
    token ``t``.

    transformers' layer, once full, rolls its whole window left by one token per decode step
    (three passes over it, about 8% of gemma-3-1b's GPU time in static mode); here a decode step
    writes one slot (``kv_cache_ring_write`` at the mask's absolute device position, which also
    advances the layer's device length) and counts the token on the host as transformers does.
    Decode attention reads all slots, order-free. Several new tokens (a prefill, a continuation)
    go through transformers' ``update``, which needs the window in order: a full window is
    rotated into order before it and back into ring order after it (eager steps, not the
    compiled decode step)."""
    window = layer.max_cache_len
    if position is not None and k.shape[2] == 1:
        if not layer.is_initialized:
            layer.lazy_initialization(k, v)
        kv_cache_ring_write(k, v, layer.keys, layer.values, position, layer.cumulative_length)
        layer.cumulative_length_int += 1
        return layer.keys, layer.values
    if layer.is_initialized and layer.cumulative_length_int >= window:
        _rotate(layer, -(layer.cumulative_length_int % window))
    out = update()
    if layer.cumulative_length_int >= window:
        _rotate(layer, layer.cumulative_length_int % window)
    return out


def _rotate(layer, shift: int) -> None:
    """Roll a layer's key/value slots by ``shift`` in place (``StaticLayer``'s tensors keep
    their addresses: a compiled step holds them)."""
    if shift:
        layer.keys.copy_(torch.roll(layer.keys, shift, dims=2))
        layer.values.copy_(torch.roll(layer.values, shift, dims=2))
