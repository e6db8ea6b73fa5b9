"""The static-cache write of keys and values of two widths at a device position
(`tilegym.ops.latent_cache`, DeepSeek V2/V3's latent and rope key).

CPU: the custom op's CPU implementation writes what transformers' ``StaticLayer.update`` writes
and sets its length, and passes opcheck; bad inputs get one clear error; every launch fits a
declared AOT signature; the signatures compile for sm_90, sm_100 and sm_120 (slow).
GPU: the kernel against the reference into NaN-poisoned caches (only the new slots change) at
decode and prompt sizes, odd batch sizes and positions, int32 and int64 lengths.
"""

from __future__ import annotations

import pytest
import torch

from tilegym.ops import latent_cache as lc
from tilegym.ops.attention import AttentionInputError
from tilegym.ops.testing import launch_fits


def _caches(b, t, dk, dv, device="cpu", dtype=torch.float32, fill=0.0):
    k = torch.full((b, 1, t, dk), fill, dtype=dtype, device=device)
    return k, torch.full((b, 1, t, dv), fill, dtype=dtype, device=device)


def test_cpu_op_writes_what_the_static_layer_update_writes():
    from transformers.cache_utils import StaticLayer

    from tilegym.ops import library

    gen = torch.Generator().manual_seed(0)
    b, t, dk, dv = 2, 16, 32, 8
    layer = StaticLayer(max_cache_len=t)
    prompt = (torch.randn(b, 1, 5, dk, generator=gen), torch.randn(b, 1, 5, dv, generator=gen))
    layer.update(*prompt)
    step = (torch.randn(b, 1, 1, dk, generator=gen), torch.randn(b, 1, 1, dv, generator=gen))
    keys, values = layer.keys.clone(), layer.values.clone()
    length = layer.cumulative_length.clone()
    library.latent_cache_write_at(*step, keys, values, torch.tensor([5], dtype=torch.int32), length)
    layer.update(*step)
    assert torch.equal(keys, layer.keys) and torch.equal(values, layer.values)
    assert int(length) == int(layer.cumulative_length) == 6
    kc, vc = _caches(b, t, dk, dv, dtype=torch.bfloat16)
    args = (step[0].bfloat16(), step[1].bfloat16(), kc, vc)
    torch.library.opcheck(
        library.latent_cache_write_at_op,
        (*args, torch.tensor([3], dtype=torch.int32), torch.zeros((), dtype=torch.int64)),
    )


@pytest.mark.parametrize(
    ("new", "cache", "words"),
    [
        (((2, 1, 1, 32), (2, 1, 2, 8)), ((2, 1, 9, 32), (2, 1, 9, 8)), "alike"),
        (((2, 1, 1, 32), (2, 1, 1, 8)), ((2, 1, 9, 32), (2, 1, 9, 16)), "do not fit"),
        (((2, 1, 1, 32), (2, 1, 1, 8)), ((3, 1, 9, 32), (3, 1, 9, 8)), "do not fit"),
        (((2, 1, 12, 32), (2, 1, 12, 8)), ((2, 1, 9, 32), (2, 1, 9, 8)), "capacity"),
    ],
)
def test_bad_shapes_get_one_clear_error(new, cache, words):
    k, v = (torch.zeros(s, dtype=torch.bfloat16) for s in new)
    kc, vc = (torch.zeros(s, dtype=torch.bfloat16) for s in cache)
    pos, length = torch.zeros(1, dtype=torch.int32), torch.zeros((), dtype=torch.int64)
    with pytest.raises(AttentionInputError, match=words):
        lc.latent_cache_write_at(k, v, kc, vc, pos, length)


def test_bad_counters_dtypes_and_devices_get_one_clear_error():
    k, v = (
        torch.zeros(1, 1, 1, 32, dtype=torch.bfloat16),
        torch.zeros(1, 1, 1, 8, dtype=torch.bfloat16),
    )
    kc, vc = _caches(1, 4, 32, 8, dtype=torch.bfloat16)
    length = torch.zeros((), dtype=torch.int64)
    with pytest.raises(AttentionInputError, match="position must be int32"):
        lc.latent_cache_write_at(k, v, kc, vc, torch.zeros(1, dtype=torch.int64), length)
    pos = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(AttentionInputError, match="length"):
        lc.latent_cache_write_at(k, v, kc, vc, pos, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(AttentionInputError, match="dtypes"):
        lc.latent_cache_write_at(k, v.half(), kc, vc, pos, length)
    with pytest.raises(AttentionInputError, match="CUDA"):
        lc.latent_cache_write_at(k, v, kc, vc, pos, length)


@pytest.mark.parametrize(("b", "s"), [(1, 1), (8, 1), (1, 2048), (3, 37)])
def test_every_launch_fits_a_declared_signature(b, s):
    sigs = lc.aot_signatures()[lc.latent_cache_write_at_kernel]
    k, v = (
        torch.zeros(b, 1, s, 512, dtype=torch.bfloat16),
        torch.zeros(b, 1, s, 64, dtype=torch.bfloat16),
    )
    kc, vc = _caches(b, 4096, 512, 64, dtype=torch.bfloat16)
    length = torch.zeros((), dtype=torch.int64)  # transformers' StaticLayer.cumulative_length
    grid, args = lc.launch_args(k, v, kc, vc, torch.zeros(1, dtype=torch.int32), length)
    assert any(launch_fits(sig, args) for sig in sigs), args[6:]
    assert grid[1] == b and grid[0] * args[-1] >= s > (grid[0] - 1) * args[-1]


@pytest.mark.slow
def test_signatures_compile_for_every_target():
    from tilegym.kernel_inventory.compile import compile_kernel, toolchain_problem

    if toolchain_problem():
        pytest.skip(toolchain_problem())
    sigs = lc.aot_signatures()[lc.latent_cache_write_at_kernel]
    for gpu in ("sm_90", "sm_100", "sm_120"):
        assert compile_kernel(lc.latent_cache_write_at_kernel, sigs, gpu) is None, gpu


# ------------------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("b", "s", "t", "pos", "dk", "dv"),
    [
        (1, 1, 2176, 2048, 512, 64),  # DeepSeek-V2-Lite decode steps
        (8, 1, 512, 300, 512, 64),
        (3, 1, 40, 39, 512, 64),  # the last slot
        (1, 2048, 2176, 0, 512, 64),  # a prompt
        (3, 37, 100, 50, 512, 64),  # a chunk no multiple of the token tile
        (5, 1, 64, 7, 128, 32),
    ],
)
@pytest.mark.parametrize("length_dtype", [torch.int64, torch.int32])
def test_write_matches_the_reference(b, s, t, pos, dk, dv, length_dtype, gen):
    k = torch.randn(b, 1, s, dk, generator=gen, device="cuda").bfloat16()
    v = torch.randn(b, 1, s, dv, generator=gen, device="cuda").bfloat16()
    kc, vc = _caches(b, t, dk, dv, "cuda", torch.bfloat16, float("nan"))
    want_k, want_v = kc.clone(), vc.clone()
    position = torch.tensor([pos], dtype=torch.int32, device="cuda")
    length = torch.zeros((), dtype=length_dtype, device="cuda")
    want_len = length.clone()
    lc.latent_cache_write_at(k, v, kc, vc, position, length)
    lc.reference_latent_cache_write_at(k, v, want_k, want_v, position, want_len)
    # equal everywhere, NaN where nothing was written
    assert torch.equal(kc.nan_to_num(7.0), want_k.nan_to_num(7.0))
    assert torch.equal(vc.nan_to_num(7.0), want_v.nan_to_num(7.0))
    assert int(length) == int(want_len) == pos + s
