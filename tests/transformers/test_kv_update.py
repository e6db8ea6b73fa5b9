"""Where a fused kernel may write a step's keys and values itself (``static_write_target``):
only into an allocated static layer of the activations' dtype, at a device position."""

from __future__ import annotations

import torch
from transformers import LlamaConfig
from transformers.cache_utils import StaticCache

from tilegym.transformers.attention import TileMask
from tilegym.transformers.kv_update import static_write_target


def _cache(dtype=torch.bfloat16, initialized=True):
    config = LlamaConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2
    )
    cache = StaticCache(config=config, max_cache_len=16)
    if initialized:
        kv = torch.randn(1, 2, 1, 8).to(dtype)
        for layer in cache.layers:
            layer.lazy_initialization(kv, kv)
    return cache


def _device_mask(position=3):
    return TileMask(q_length=1, kv_length=16, q_start=torch.tensor([position], dtype=torch.int32))


def test_a_static_layer_of_the_activations_dtype_is_the_target():
    cache, mask = _cache(), _device_mask()
    layer, position = static_write_target(cache, 1, mask, torch.bfloat16)
    assert layer is cache.layers[1] and position is mask.q_start


def test_a_cache_in_another_dtype_keeps_its_own_write():
    assert static_write_target(_cache(), 0, _device_mask(), torch.float16) is None
    assert static_write_target(_cache(torch.float32), 0, _device_mask(), torch.bfloat16) is None


def test_no_target_without_a_device_position_or_an_allocated_layer():
    host = TileMask(q_length=1, kv_length=16, q_start=3)
    assert static_write_target(_cache(), 0, host, torch.bfloat16) is None
    assert static_write_target(_cache(initialized=False), 0, _device_mask(), torch.bfloat16) is None
    assert static_write_target(None, 0, _device_mask(), torch.bfloat16) is None
