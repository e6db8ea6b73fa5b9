"""KV cache buffers: growth policy (CPU) and the cuTile write kernel against slice assignment."""

import pytest
import torch

from tilegym.ops.kv_cache import KVBuffer, grown_capacity, kv_cache_write


@pytest.mark.parametrize(
    "cur,need,want", [(0, 1, 256), (256, 257, 512), (512, 1500, 1536), (1024, 1025, 2048)]
)
def test_grown_capacity_doubles(cur, need, want):
    assert grown_capacity(cur, need) == want


def test_growth_copies_are_amortized_linear():
    buf = KVBuffer.allocate(1, 2, 4, 8, torch.float32, "cpu")
    copied = 0
    for _ in range(5000):
        before = buf.capacity
        buf.append(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8))
        if buf.capacity != before:
            copied += buf.length - 1
    assert buf.length == 5000
    assert copied < 2 * 5000  # doubling: total copied tokens stay linear in the length


def test_append_returns_views_of_all_tokens():
    buf = KVBuffer.allocate(2, 3, 4, 8, torch.float32, "cpu")
    ks, vs = [], []
    for s in (3, 1, 5, 1):
        k, v = torch.randn(2, 3, s, 8), torch.randn(2, 3, s, 8)
        ks.append(k)
        vs.append(v)
        keys, values = buf.append(k, v)
    assert torch.equal(keys, torch.cat(ks, 2)) and torch.equal(values, torch.cat(vs, 2))
    assert keys.data_ptr() == buf.keys.data_ptr()


def _nan_cache(b, h, cap, d, width):
    """A NaN ``[b, h, cap, d]`` cache that is the first ``d`` columns of a ``width``-wide buffer
    (``width > d``: the columns a 128-wide tile of head_dim 96 must not touch)."""
    return torch.full((b, h, cap, width), float("nan"), dtype=torch.bfloat16, device="cuda")[
        ..., :d
    ]


def _assert_written_only(cache, new, pos):
    s_new, cap = new.shape[2], cache.shape[2]
    assert torch.equal(cache[:, :, pos : pos + s_new], new)
    untouched = torch.ones(cap, dtype=torch.bool, device="cuda")
    untouched[pos : pos + s_new] = False
    assert torch.isnan(cache[:, :, untouched]).all()
    wide = cache.as_strided(
        (*cache.shape[:3], cache.stride(2)), cache.stride(), cache.storage_offset()
    )
    assert torch.isnan(wide[..., cache.shape[3] :]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("d,width", [(64, 64), (96, 96), (96, 160), (128, 128), (256, 256)])
@pytest.mark.parametrize("pos,s_new", [(0, 1), (0, 77), (5, 1), (255, 64), (100, 130), (511, 1)])
def test_kv_cache_write_matches_slice_assignment(d, width, pos, s_new, gen):
    b, h, cap = 3, 8, 512 + 64
    k_new = torch.randn(b, s_new, h, d, device="cuda", generator=gen).bfloat16().transpose(1, 2)
    v_new = torch.randn(b, s_new, h, d, device="cuda", generator=gen).bfloat16().transpose(1, 2)
    k_cache, v_cache = _nan_cache(b, h, cap, d, width), _nan_cache(b, h, cap, d, width)
    kv_cache_write(k_new, v_new, k_cache, v_cache, pos)
    _assert_written_only(k_cache, k_new, pos)
    _assert_written_only(v_cache, v_new, pos)


@pytest.mark.gpu
def test_kv_cache_write_rejects_overflow(gen):
    from tilegym.ops.attention import AttentionInputError

    k = torch.randn(1, 2, 4, 64, device="cuda", generator=gen).bfloat16()
    cache = torch.empty(1, 2, 6, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(AttentionInputError, match="exceed capacity"):
        kv_cache_write(k, k, cache, cache.clone(), 3)


@pytest.mark.gpu
def test_buffer_append_on_gpu_matches_reference_through_growth_and_rejects_bad_inputs(gen):
    from tilegym.ops.attention import AttentionInputError

    buf = KVBuffer.allocate(2, 3, 5, 64, torch.bfloat16, "cuda")
    ks, vs = [], []
    for s_new in (7, 1, 1, 0, 130, 1):  # prefill, decode steps, an empty write, growth twice
        k = torch.randn(2, 3, s_new, 64, device="cuda", generator=gen).bfloat16()
        v = torch.randn(2, 3, s_new, 64, device="cuda", generator=gen).bfloat16()
        ks.append(k)
        vs.append(v)
        keys, values = buf.append(k, v)
    assert buf.length == 140 and buf.capacity >= 140
    assert torch.equal(keys, torch.cat(ks, dim=2)) and torch.equal(values, torch.cat(vs, dim=2))
    wrong_heads = torch.randn(2, 4, 1, 64, device="cuda", generator=gen).bfloat16()
    with pytest.raises(AttentionInputError, match="does not fit"):
        buf.append(wrong_heads, wrong_heads)
    with pytest.raises(AttentionInputError, match="dtype"):
        buf.append(ks[1].half(), vs[1].half())
    assert buf.length == 140


@pytest.mark.gpu
@pytest.mark.parametrize("d,width", [(128, 128), (96, 160), (256, 256)])
@pytest.mark.parametrize("pos,s_new", [(0, 1), (0, 77), (5, 1), (255, 64), (511, 1)])
def test_kv_cache_write_at_device_position_advances_the_length(d, width, pos, s_new, gen):
    from tilegym.ops.kv_cache import kv_cache_write_at

    b, h, cap = 2, 8, 512 + 64
    k_new = torch.randn(b, s_new, h, d, device="cuda", generator=gen).bfloat16().transpose(1, 2)
    v_new = torch.randn(b, h, s_new, d, device="cuda", generator=gen).bfloat16()
    k_cache, v_cache = _nan_cache(b, h, cap, d, width), _nan_cache(b, h, cap, d, width)
    length = torch.tensor(-7, device="cuda")  # a StaticLayer's 0-d int64 counter, stale
    kv_cache_write_at(
        k_new,
        v_new,
        k_cache,
        v_cache,
        torch.tensor([pos], device="cuda", dtype=torch.int32),
        length,
    )
    assert int(length) == pos + s_new
    _assert_written_only(k_cache, k_new, pos)
    _assert_written_only(v_cache, v_new, pos)


def test_kv_cache_write_at_reference_and_input_checks():
    from tilegym.ops.attention import AttentionInputError
    from tilegym.ops.kv_cache import kv_cache_write_at, reference_kv_cache_write_at

    k_new, v_new = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    k_cache, v_cache = torch.zeros(1, 2, 10, 8), torch.zeros(1, 2, 10, 8)
    length = torch.tensor(0)
    reference_kv_cache_write_at(
        k_new, v_new, k_cache, v_cache, torch.tensor([4], dtype=torch.int32), length
    )
    assert int(length) == 7 and torch.equal(k_cache[:, :, 4:7], k_new)
    with pytest.raises(AttentionInputError, match="position must be int32"):
        kv_cache_write_at(k_new, v_new, k_cache, v_cache, torch.tensor([4]), length)
    with pytest.raises(AttentionInputError, match="does not fit"):
        kv_cache_write_at(k_new, v_new, k_cache[:, :1], v_cache[:, :1], torch.tensor([4]), length)


@pytest.mark.gpu
@pytest.mark.parametrize("d,width", [(128, 128), (96, 160), (256, 256)])
def test_ring_write_fills_slot_position_mod_capacity_and_advances_the_length(d, width, gen):
    """Positions 0..2*cap+2 one token each: slot ``p % cap`` takes token ``p`` and the length
    becomes ``p + 1``; nothing else (other slots, the columns past ``d``) is touched."""
    from tilegym.ops.kv_cache import kv_cache_ring_write

    b, h, cap = 2, 3, 5
    k_cache, v_cache = _nan_cache(b, h, cap, d, width), _nan_cache(b, h, cap, d, width)
    length = torch.tensor(-7, device="cuda")
    want_k = torch.full((b, h, cap, d), float("nan"), dtype=torch.bfloat16, device="cuda")
    want_v = want_k.clone()
    for p in range(2 * cap + 3):
        k_new = torch.randn(b, 1, h, d, device="cuda", generator=gen).bfloat16().transpose(1, 2)
        v_new = torch.randn(b, h, 1, d, device="cuda", generator=gen).bfloat16()
        position = torch.tensor([p], device="cuda", dtype=torch.int32)
        kv_cache_ring_write(k_new, v_new, k_cache, v_cache, position, length)
        want_k[:, :, p % cap] = k_new[:, :, 0]
        want_v[:, :, p % cap] = v_new[:, :, 0]
        assert int(length) == p + 1
        written = ~torch.isnan(want_k[0, 0, :, 0])
        for got, want in ((k_cache, want_k), (v_cache, want_v)):
            assert torch.equal(got[:, :, written], want[:, :, written])
            assert torch.isnan(got[:, :, ~written]).all()
    for cache in (k_cache, v_cache):  # the columns of a wider buffer past d
        _assert_written_only(cache, cache, 0)


def test_ring_write_reference_and_input_checks():
    from tilegym.ops.attention import AttentionInputError
    from tilegym.ops.kv_cache import kv_cache_ring_write, reference_kv_cache_ring_write

    k_cache, v_cache = torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8)
    k_new, v_new = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
    length = torch.tensor(0)
    position = torch.tensor([9], dtype=torch.int32)
    reference_kv_cache_ring_write(k_new, v_new, k_cache, v_cache, position, length)
    assert int(length) == 10 and torch.equal(k_cache[:, :, 1], k_new[:, :, 0])
    assert not k_cache[:, :, [0, 2, 3]].any()
    with pytest.raises(AttentionInputError, match="one token"):
        kv_cache_ring_write(
            k_cache[:, :, :2], v_cache[:, :, :2], k_cache, v_cache, position, length
        )
    with pytest.raises(AttentionInputError, match="position must be int32"):
        kv_cache_ring_write(k_new, v_new, k_cache, v_cache, position.long(), length)
