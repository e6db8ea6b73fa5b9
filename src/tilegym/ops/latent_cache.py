"""A static cache's write of keys and values of two widths at a device position, on cuTile.

DeepSeek V2/V3 cache per layer the normed latent (``[B, 1, T, 512]``, the layer's keys) and
the rotated rope key (``[B, 1, T, 64]``, its values). ``kv_cache.kv_cache_write_at`` writes keys
and values of one width; this is the same write (new tokens at ``Position[0]``, read on the
device, then ``Length[0] = position + S``, in one launch) with a width each. It replaces
transformers' ``StaticLayer.update`` in the compiled decode step: an ``arange`` plus the device
length, two ``index_copy_`` and the length's ``add_`` (three Inductor kernels per layer and step).
"""

from __future__ import annotations

import cuda.tile as ct
import torch

from tilegym.ops._common import PAD_ZERO, ct_dtype, next_pow2, signature, stream
from tilegym.ops.attention import AttentionInputError, array_constraint

ConstInt = ct.Constant[int]


@ct.kernel
def latent_cache_write_at_kernel(
    KNew,
    VNew,
    KCache,
    VCache,
    Position,
    Length,
    DK: ConstInt,
    DV: ConstInt,
    TILE_S: ConstInt,
):
    """Copy token tile ``bid(0)`` of (batch x head) ``bid(1)``'s new keys and values to cache
    positions from ``Position[0]`` on; block (0, 0) sets ``Length[0] = Position[0] + S``."""
    t = ct.bid(0)
    bh = ct.bid(1)
    h_all = KNew.shape[1]
    b = bh // h_all
    h = bh % h_all
    pos = ct.gather(Position, 0)
    s_new = KNew.shape[2]
    k_dst = KCache.slice(axis=2, start=pos, stop=pos + s_new)
    v_dst = VCache.slice(axis=2, start=pos, stop=pos + s_new)
    k = ct.load(KNew, index=(b, h, t, 0), shape=(1, 1, TILE_S, DK), padding_mode=PAD_ZERO)
    v = ct.load(VNew, index=(b, h, t, 0), shape=(1, 1, TILE_S, DV), padding_mode=PAD_ZERO)
    ct.store(k_dst, index=(b, h, t, 0), tile=k)
    ct.store(v_dst, index=(b, h, t, 0), tile=v)
    end = (pos + s_new).astype(Length.dtype)
    ct.scatter(Length, 0, end, mask=(ct.bid(0) + ct.bid(1)) == 0)


def tile_s(s_new: int) -> int:
    """Tokens per block: 1 at decode, 64 for a prompt."""
    return 1 if s_new == 1 else 64


def _check(k_new, v_new, k_cache, v_cache, position, length) -> None:
    if k_new.ndim != 4 or v_new.shape[:3] != k_new.shape[:3] or v_new.ndim != 4:
        raise AttentionInputError(
            f"new keys {tuple(k_new.shape)} and values {tuple(v_new.shape)}: need [B, H, S, .] "
            "alike"
        )
    b, h, s_new, _ = k_new.shape
    if (
        k_cache.shape[:2] != (b, h)
        or v_cache.shape[:3] != k_cache.shape[:3]
        or k_cache.shape[3] != k_new.shape[3]
        or v_cache.shape[3] != v_new.shape[3]
    ):
        raise AttentionInputError(
            f"caches {tuple(k_cache.shape)}/{tuple(v_cache.shape)} do not fit new keys "
            f"{tuple(k_new.shape)} and values {tuple(v_new.shape)}"
        )
    if s_new > k_cache.shape[2]:
        raise AttentionInputError(f"{s_new} new tokens exceed capacity {k_cache.shape[2]}")
    if k_new.dtype != k_cache.dtype or v_new.dtype != v_cache.dtype:
        raise AttentionInputError(
            f"dtypes {k_new.dtype}/{v_new.dtype} do not match the caches' "
            f"{k_cache.dtype}/{v_cache.dtype}"
        )
    if position.shape != (1,) or position.dtype != torch.int32:
        raise AttentionInputError(
            f"position must be int32 of shape (1,), got {position.dtype} {tuple(position.shape)}"
        )
    if length.numel() != 1 or length.dtype not in (torch.int32, torch.int64):
        raise AttentionInputError(f"length must be one int32/int64 element, got {length.dtype}")
    if not all(x.is_cuda for x in (k_new, v_new, k_cache, v_cache, position, length)):
        raise AttentionInputError("the cuTile cache write needs CUDA tensors")


def latent_cache_write_at(
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    position: torch.Tensor,
    length: torch.Tensor,
) -> None:
    """``k_cache[:, :, p:p+S] = k_new`` and ``v_cache[:, :, p:p+S] = v_new`` (widths may
    differ) for ``p = position[0]`` read on the device, then ``length.fill_(p + S)``; one launch,
    no host read. Only ``S`` is checked against the capacity: the caller's mask says where the
    tokens go."""
    _check(k_new, v_new, k_cache, v_cache, position, length)
    if k_new.stride(-1) != 1:
        k_new = k_new.contiguous()
    if v_new.stride(-1) != 1:
        v_new = v_new.contiguous()
    if k_new.shape[2]:
        grid, args = launch_args(k_new, v_new, k_cache, v_cache, position, length)
        ct.launch(stream(), grid, latent_cache_write_at_kernel, args)


def launch_args(k_new, v_new, k_cache, v_cache, position, length) -> tuple[tuple, tuple]:
    """``(grid, args)`` of one write, nothing launched."""
    b, h, s_new, dk = k_new.shape
    ts = tile_s(s_new)
    args = (k_new, v_new, k_cache, v_cache, position, length.view(1))
    consts = (next_pow2(dk), next_pow2(v_new.shape[3]), ts)
    return (-(-s_new // ts), b * h, 1), (*args, *consts)


def reference_latent_cache_write_at(k_new, v_new, k_cache, v_cache, position, length) -> None:
    """PyTorch reference of ``latent_cache_write_at`` (reads the position on the host)."""
    pos = int(position[0])
    s_new = k_new.shape[2]
    k_cache[:, :, pos : pos + s_new] = k_new
    v_cache[:, :, pos : pos + s_new] = v_new
    length.fill_(pos + s_new)


def aot_signatures(
    key_dim: int = 512, value_dim: int = 64, dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,)
) -> dict:
    """``{kernel: [KernelSignature, ...]}`` at DeepSeek-V2-Lite's widths (latent 512, rope
    key 64): the decode and prompt tiles, with transformers' int64 length."""
    sigs = []
    for dtype in dtypes:
        arrays = [array_constraint(ct_dtype(dtype), 4) for _ in range(4)]
        counters = [array_constraint(ct.int32, 1), array_constraint(ct.int64, 1)]
        for ts in (1, 64):
            sigs.append(signature(*arrays, *counters, next_pow2(key_dim), next_pow2(value_dim), ts))
    return {latent_cache_write_at_kernel: sigs}
