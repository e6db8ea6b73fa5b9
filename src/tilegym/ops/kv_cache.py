"""Preallocated KV cache buffers and the cuTile kernel that writes new keys/values into them.

Layout: one key and one value buffer per layer, ``[B, Hkv, capacity, D]``; positions
``[0, length)`` are valid. The attention kernels read the views ``buf[:, :, :length]`` directly,
so a decode step writes one token per head instead of concatenating the whole history.
Growth past ``capacity`` doubles it (amortized O(1) copies per token).

The kernels' ``D`` is ``head_tile(head_dim)``: head_dim 96 moves 128-wide tiles whose loads
zero-fill and whose stores drop the columns past 96, as in the attention kernels.
"""

from __future__ import annotations

import cuda.tile as ct
import torch

from tilegym.ops._common import stream
from tilegym.ops.attention import AttentionInputError, array_constraint, head_tile

ConstInt = ct.Constant[int]


def _write_tokens(KNew, VNew, KCache, VCache, pos, D, TILE_S):
    """Copy token tile ``bid(0)`` of the new keys and values of (batch x head) ``bid(1)`` to
    cache positions ``[pos, pos + S)``."""
    t = ct.bid(0)
    bh = ct.bid(1)
    h_all = KNew.shape[1]
    b = bh // h_all
    h = bh % h_all
    s_new = KNew.shape[2]
    k_dst = KCache.slice(axis=2, start=pos, stop=pos + s_new)
    v_dst = VCache.slice(axis=2, start=pos, stop=pos + s_new)
    k = ct.load(KNew, index=(b, h, t, 0), shape=(1, 1, TILE_S, D), padding_mode=ct.PaddingMode.ZERO)
    v = ct.load(VNew, index=(b, h, t, 0), shape=(1, 1, TILE_S, D), padding_mode=ct.PaddingMode.ZERO)
    ct.store(k_dst, index=(b, h, t, 0), tile=k)
    ct.store(v_dst, index=(b, h, t, 0), tile=v)


@ct.kernel
def kv_cache_write_kernel(KNew, VNew, KCache, VCache, pos: int, D: ConstInt, TILE_S: ConstInt):
    """Copy one (token tile, batch*head) of the new keys and values to ``[pos, pos + S)``."""
    _write_tokens(KNew, VNew, KCache, VCache, pos, D, TILE_S)


@ct.kernel
def kv_cache_write_at_kernel(
    KNew, VNew, KCache, VCache, Position, Length, D: ConstInt, TILE_S: ConstInt
):
    """``kv_cache_write_kernel`` at the position held in ``Position[0]`` (read on the device),
    and ``Length[0] = position + S`` (written by block (0, 0); ``Position`` is a separate
    tensor, so no block reads a length another one has already advanced)."""
    pos = ct.gather(Position, 0)
    _write_tokens(KNew, VNew, KCache, VCache, pos, D, TILE_S)
    end = (pos + KNew.shape[2]).astype(Length.dtype)
    ct.scatter(Length, 0, end, mask=(ct.bid(0) + ct.bid(1)) == 0)


@ct.kernel
def kv_cache_ring_write_kernel(KNew, VNew, KCache, VCache, Position, Length, D: ConstInt):
    """One new token per (batch x head) ``bid(1)`` into slot ``Position[0] % capacity`` of a
    ring buffer, and ``Length[0] = Position[0] + 1`` (written by block (0, 0))."""
    pos = ct.gather(Position, 0)
    _write_tokens(KNew, VNew, KCache, VCache, pos % KCache.shape[2], D, 1)
    ct.scatter(Length, 0, (pos + 1).astype(Length.dtype), mask=ct.bid(1) == 0)


def _tile_s(s_new: int) -> int:
    return 1 if s_new == 1 else 64


def _check_write(k_new, v_new, k_cache, v_cache, start: int) -> None:
    """One clear error for new keys/values that do not fit the cache from ``start`` on."""
    if k_new.shape != v_new.shape or k_new.ndim != 4:
        raise AttentionInputError(f"new keys/values shapes {k_new.shape}/{v_new.shape} differ")
    b, h, s_new, d = k_new.shape
    if k_cache.shape[:2] != (b, h) or k_cache.shape[3] != d or k_cache.shape != v_cache.shape:
        raise AttentionInputError(f"cache {tuple(k_cache.shape)} does not fit {tuple(k_new.shape)}")
    if start < 0 or start + s_new > k_cache.shape[2]:
        raise AttentionInputError(
            f"positions [{start}, {start + s_new}) exceed capacity {k_cache.shape[2]}"
        )
    if k_new.dtype != k_cache.dtype or v_new.dtype != v_cache.dtype:
        raise AttentionInputError(f"dtype {k_new.dtype} does not match the cache's {k_cache.dtype}")


def kv_cache_write(
    k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: int
) -> None:
    """``k_cache[:, :, pos:pos+S] = k_new`` (and values) with one cuTile launch."""
    _check_write(k_new, v_new, k_cache, v_cache, pos)
    if k_new.shape[2]:
        _launch_write(k_new, v_new, k_cache, v_cache, int(pos))


def _launch_write(k_new, v_new, k_cache, v_cache, pos: int) -> None:
    """The launch alone: the caller has checked shapes, dtypes and capacity (decode calls this
    once per layer and token, so its host time counts)."""
    _launch(kv_cache_write_kernel, k_new, v_new, k_cache, v_cache, (pos,))


def _launch(kernel, k_new, v_new, k_cache, v_cache, where: tuple) -> None:
    """One write kernel over (token tiles, batch x heads); ``where`` its position arguments."""
    if k_new.stride(-1) != 1:
        k_new = k_new.contiguous()
    if v_new.stride(-1) != 1:
        v_new = v_new.contiguous()
    b, h, s_new, d = k_new.shape
    tile_s = _tile_s(s_new)
    consts = (head_tile(d),) if kernel is kv_cache_ring_write_kernel else (head_tile(d), tile_s)
    ct.launch(
        stream(),
        (ct.cdiv(s_new, tile_s), b * h, 1),
        kernel,
        (k_new, v_new, k_cache, v_cache, *where, *consts),
    )


def check_device_counters(position: torch.Tensor, length: torch.Tensor) -> None:
    """One clear error for a device-side write position / cache length a kernel cannot take."""
    if position.shape != (1,) or position.dtype != torch.int32:
        raise AttentionInputError(
            f"position must be int32 of shape (1,), got {position.dtype} {tuple(position.shape)}"
        )
    if length.numel() != 1 or length.dtype not in (torch.int32, torch.int64):
        raise AttentionInputError(f"length must be one int32/int64 element, got {length.dtype}")


def kv_cache_write_at(
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    position: torch.Tensor,
    length: torch.Tensor,
) -> None:
    """Static-cache write: ``k_cache[:, :, p:p+S] = k_new`` (and values) for ``p = position[0]``
    read on the device, then ``length.fill_(p + S)``; one launch, no host synchronization.

    ``position`` is int32 ``[1]``; ``length`` a one-element int32/int64 tensor (transformers'
    ``StaticLayer.cumulative_length``, 0-d). Only ``[0, S)`` is checked against the capacity
    (``p`` would have to be read on the host): the caller's mask says where the token goes.
    """
    _check_write(k_new, v_new, k_cache, v_cache, 0)
    check_device_counters(position, length)
    if k_new.shape[2]:
        _launch(
            kv_cache_write_at_kernel, k_new, v_new, k_cache, v_cache, (position, length.view(1))
        )


def kv_cache_ring_write(
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    position: torch.Tensor,
    length: torch.Tensor,
) -> None:
    """Ring-buffer write of one new token: slot ``position[0] % capacity`` (the absolute
    position, read on the device), then ``length.fill_(position[0] + 1)``; one launch.

    A sliding-window cache kept this way writes one token per decode step where transformers'
    ``StaticSlidingWindowLayer`` rolls the whole window (three full passes over it). Its slots
    then hold token ``t`` at ``t % capacity``, which decode attention over all of them does not
    mind (it is order-free) and ``tilegym.transformers`` converts wherever order matters."""
    _check_write(k_new, v_new, k_cache, v_cache, 0)
    if k_new.shape[2] != 1:
        raise AttentionInputError(f"a ring write takes one token, got {k_new.shape[2]}")
    check_device_counters(position, length)
    _launch(kv_cache_ring_write_kernel, k_new, v_new, k_cache, v_cache, (position, length.view(1)))


def reference_kv_cache_ring_write(k_new, v_new, k_cache, v_cache, position, length) -> None:
    """PyTorch reference of ``kv_cache_ring_write`` (reads the position on the host)."""
    pos = int(position[0])
    reference_kv_cache_write(k_new, v_new, k_cache, v_cache, pos % k_cache.shape[2])
    length.fill_(pos + 1)


def reference_kv_cache_write_at(k_new, v_new, k_cache, v_cache, position, length) -> None:
    """PyTorch reference of ``kv_cache_write_at`` (reads the position on the host)."""
    pos = int(position[0])
    reference_kv_cache_write(k_new, v_new, k_cache, v_cache, pos)
    length.fill_(pos + k_new.shape[2])


def reference_kv_cache_write(k_new, v_new, k_cache, v_cache, pos: int) -> None:
    """PyTorch reference: slice assignment."""
    s_new = k_new.shape[2]
    k_cache[:, :, pos : pos + s_new] = k_new
    v_cache[:, :, pos : pos + s_new] = v_new


def grown_capacity(current: int, needed: int, granule: int = 256) -> int:
    """Capacity after growth: at least double, at least ``needed``, rounded up to ``granule``."""
    cap = max(needed, 2 * current)
    return -(-cap // granule) * granule


class KVBuffer:
    """One layer's preallocated key/value storage with length bookkeeping and doubling growth."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int = 0):
        self.keys = keys
        self.values = values
        self.length = length

    @classmethod
    def allocate(cls, batch, heads, capacity, head_dim, dtype, device) -> KVBuffer:
        shape = (batch, heads, max(1, capacity), head_dim)
        return cls(
            torch.empty(shape, dtype=dtype, device=device),
            torch.empty(shape, dtype=dtype, device=device),
        )

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def ensure_capacity(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        cap = grown_capacity(self.capacity, needed)
        b, h, _, d = self.keys.shape
        new_k = torch.empty((b, h, cap, d), dtype=self.keys.dtype, device=self.keys.device)
        new_v = torch.empty_like(new_k)
        new_k[:, :, : self.length] = self.keys[:, :, : self.length]
        new_v[:, :, : self.length] = self.values[:, :, : self.length]
        self.keys, self.values = new_k, new_v

    def append(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new tokens after the valid ones; return views of all valid keys/values."""
        shape, keys = k_new.shape, self.keys
        end = self.length + shape[2]
        if end > keys.shape[2]:
            self.ensure_capacity(end)
            keys = self.keys
        if not k_new.is_cuda:
            reference_kv_cache_write(k_new, v_new, keys, self.values, self.length)
        elif (
            shape[2]
            and v_new.shape == shape
            and shape[:2] == keys.shape[:2]
            and shape[3] == keys.shape[3]
            and k_new.dtype == v_new.dtype == keys.dtype
        ):
            _launch_write(k_new, v_new, keys, self.values, self.length)
        else:  # anything unusual: the checked path (one clear error, or nothing to write)
            kv_cache_write(k_new, v_new, keys, self.values, self.length)
        self.length = end
        return keys[:, :, :end], self.values[:, :, :end]


def aot_signatures(head_dim: int = 128):
    """``{kernel: [KernelSignature, ...]}`` for the AOT compile gate (decode and prefill tiles)."""
    from cuda.tile.compilation import CallingConvention, KernelSignature, ScalarConstraint

    sigs = [
        KernelSignature(
            [
                array_constraint(ct.bfloat16, 4),
                array_constraint(ct.bfloat16, 4),
                array_constraint(ct.bfloat16, 4),
                array_constraint(ct.bfloat16, 4),
                ScalarConstraint(ct.int32),
                head_tile(head_dim),
                tile_s,
            ],
            CallingConvention.cutile_python_v1(),
        )
        for tile_s in (1, 64)
    ]
    at_sigs = [
        KernelSignature(
            [
                *(array_constraint(ct.bfloat16, 4) for _ in range(4)),
                array_constraint(ct.int32, 1),
                array_constraint(ct.int64, 1),
                head_tile(head_dim),
                tile_s,
            ],
            CallingConvention.cutile_python_v1(),
        )
        for tile_s in (1, 64)
    ]
    ring_sigs = [
        KernelSignature(
            [
                *(array_constraint(ct.bfloat16, 4) for _ in range(4)),
                array_constraint(ct.int32, 1),
                array_constraint(ct.int64, 1),
                head_tile(head_dim),
            ],
            CallingConvention.cutile_python_v1(),
        )
    ]
    return {
        kv_cache_write_kernel: sigs,
        kv_cache_write_at_kernel: at_sigs,
        kv_cache_ring_write_kernel: ring_sigs,
    }
