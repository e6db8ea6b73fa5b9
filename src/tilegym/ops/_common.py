"""Helpers shared by the op modules: tile sizing, dtype maps and AOT signature building."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import cuda.tile as ct
import torch
from cuda.tile.compilation import ArrayConstraint, CallingConvention, KernelSignature

PAD_ZERO = ct.PaddingMode.ZERO

#: dtypes every op accepts for activations (weights may be any of these too).
ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

_CT_DTYPE = {torch.bfloat16: ct.bfloat16, torch.float16: ct.float16, torch.float32: ct.float32}


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (tile extents must be powers of two)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def ct_dtype(dtype: torch.dtype):
    """The cuda.tile dtype for a torch dtype."""
    return _CT_DTYPE[dtype]


_STREAMS: dict[tuple[int, int], torch.cuda.Stream] = {}


def stream(device: torch.device | None = None) -> torch.cuda.Stream:
    """The current CUDA stream: kernels run in order with the surrounding PyTorch ops.

    Same stream as ``torch.cuda.current_stream()``, at a fraction of its host cost: that call
    resolves the device and re-checks CUDA availability in Python on every launch (a fifth of
    the host time of a patched model's decode step in an H200 profile). Here two C calls read
    the current device (or ``device``'s) and raw stream; the Stream object is cached.
    """
    index = torch._C._cuda_getDevice() if device is None or device.index is None else device.index
    key = (index, torch._C._cuda_getCurrentRawStream(index))
    current = _STREAMS.get(key)
    if current is None:
        if len(_STREAMS) >= 64:  # streams come and go (e.g. per-request side streams)
            _STREAMS.clear()
        current = _STREAMS[key] = torch.cuda.current_stream(index)
    return current


def check_activation(name: str, t: torch.Tensor) -> None:
    """One clear error for inputs the kernels do not handle (instead of a compile failure)."""
    if not t.is_cuda:
        raise ValueError(f"{name} must be a CUDA tensor, got device {t.device}")
    if t.dtype not in ACT_DTYPES:
        raise ValueError(f"{name} dtype {t.dtype} is not supported (bf16, fp16, fp32)")


def _as_ct(dtype):
    """A torch dtype as cuTile's; a cuTile dtype as it is."""
    return ct_dtype(dtype) if isinstance(dtype, torch.dtype) else dtype


def array_sig(dtype, ndim: int, *, last_contiguous: bool = True) -> ArrayConstraint:
    """An ArrayConstraint as the JIT derives it for a torch tensor (int32 indices)."""
    return ArrayConstraint(
        _as_ct(dtype),
        ndim,
        index_dtype=ct.int32,
        stride_lower_bound_incl=0,
        alias_groups=(),
        may_alias_internally=False,
        stride_constant=(None,) * (ndim - 1) + (1,) if last_contiguous else None,
    )


def aligned_array_sig(dtype, ndim: int) -> ArrayConstraint:
    """An array as the model hands its activations and weights over: unit last stride, 16-byte
    aligned base and row strides, which is what lets a kernel's tiles load through TMA.
    ``dtype``: a cuTile or torch dtype, as ``array_sig`` takes."""
    dtype = _as_ct(dtype)
    step = 16 // (4 if dtype in (ct.int32, ct.float32) else 2)
    return ArrayConstraint(
        dtype,
        ndim,
        index_dtype=ct.int32,
        stride_lower_bound_incl=0,
        alias_groups=(),
        may_alias_internally=False,
        stride_constant=(None,) * (ndim - 1) + (1,),
        stride_divisible_by=(step,) * (ndim - 1) + (1,),
        base_addr_divisible_by=16,
    )


def signature(*params) -> KernelSignature:
    """A KernelSignature in the calling convention launches use."""
    return KernelSignature(params, CallingConvention.cutile_python_v1())


#: activation dtypes the AOT inventory compiles every kernel for.
AOT_DTYPES = (torch.bfloat16, torch.float16)


#: Sentinel for "use the module's default" in variant keyword arguments (None is a valid value).
DEFAULT = object()

_VARIANTS: dict = {}


def with_hints(kernel, **hints):
    """``kernel`` compiled with other compiler hints (``occupancy``, ``num_ctas``, ...; None =
    the compiler's choice), cached per kernel and hints so each is compiled once per process."""
    key = (id(kernel), tuple(sorted(hints.items())))
    if key not in _VARIANTS:
        _VARIANTS[key] = kernel.replace_hints(**hints)
    return _VARIANTS[key]


def with_occupancy(kernel, occupancy: int | None, default: int | None):
    """``kernel`` with another occupancy hint; ``kernel`` itself when ``occupancy`` is the hint
    it was declared with."""
    if occupancy == default:
        return kernel
    return with_hints(kernel, occupancy=occupancy)


_SM_COUNT: dict = {}


def sm_count(device: torch.device) -> int:
    """Number of SMs of a CUDA device (cached)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


_PRIVATE = threading.local()


@contextmanager
def private_buffers() -> Iterator[None]:
    """Within this block the ops allocate their scratch tensors (split-K workspace, tile
    counters, placeholders) per call instead of reusing process-wide ones.

    The compiled (``torch.compile`` + CUDA graph) path runs the ops inside it: a captured graph
    keeps the addresses it was recorded with, so its scratch memory must belong to the graph's
    own pool, not to a cache that eager code may later grow and free."""
    before = getattr(_PRIVATE, "on", False)
    _PRIVATE.on = True
    try:
        yield
    finally:
        _PRIVATE.on = before


def buffers_private() -> bool:
    """True inside ``private_buffers()``."""
    return getattr(_PRIVATE, "on", False)


@ct.function
def keep_in_slot(vals, idx, slot, j, best, arg):
    """Top-k bookkeeping: row-wise ``best`` and ``arg`` (each (TM, 1)) into slot ``j`` of the
    (TM, KP) value and index tiles (``slot`` is each column's slot number)."""
    here = slot == j
    vals = ct.where(here, ct.broadcast_to(best, vals.shape), vals)
    idx = ct.where(here, ct.broadcast_to(arg, idx.shape), idx)
    return vals, idx


@ct.function
def take_max(scores, cols, slot, j, vals, idx, gone):
    """One top-k round: each row's maximum and its first column into slot ``j``; that column's
    score becomes ``gone`` (below every score). Returns (scores, vals, idx)."""
    best = ct.max(scores, axis=1, keepdims=True)
    arg = ct.astype(ct.argmax(scores, axis=1, keepdims=True), ct.int32)
    vals, idx = keep_in_slot(vals, idx, slot, j, best, arg)
    return ct.where(cols == ct.broadcast_to(arg, scores.shape), gone, scores), vals, idx
