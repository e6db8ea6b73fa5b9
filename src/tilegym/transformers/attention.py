"""cuTile attention for transformers models, registered under its own name ("tilegym").

``enable(model)`` registers the attention function in transformers' ``AttentionInterface`` and a
matching mask builder in ``AttentionMaskInterface`` (never touching "sdpa"), gives the model its
own config copy (models built from one config object share ``_attn_implementation``), switches
that model to "tilegym" and returns a callable that restores it.

The mask builder does not materialize ``[B, 1, Sq, Skv]`` masks: it recognizes transformers'
causal and sliding-window-causal patterns and hands the kernels a ``TileMask`` (offsets, window,
per-key padding validity). Supported envelope, anything else raises ``TilegymAttentionError``:

- causal decoder self-attention (``is_causal``), bf16/fp16, GQA, head_dim 64, 96, 128 or 256
  (the model patch serves ``SUPPORTED_HEAD_DIMS``);
- 2D padding masks (any pattern of valid keys, e.g. left padding), sliding window;
- attention sinks (gpt-oss's ``s_aux``: a per-head logit in every softmax row, then dropped);
- no dropout, softcap, position bias or custom 4D / or/and mask functions.

KV cache: the model works with transformers' default ``DynamicCache``. ``make_cache(model,
batch_size, max_length)`` returns a ``TileKVCache`` whose layers preallocate
``[B, Hkv, max_length, D]`` buffers written by a cuTile kernel (no ``torch.cat`` per step) and
double their capacity when generation runs past it. Use it as
``model.generate(..., past_key_values=make_cache(model, batch, prompt_len + max_new_tokens))``
(transformers >= 5.2x also accepts ``cache=``): ``generate`` then calls ``cache.update`` per layer
and step, which writes the new token with one cuTile launch and hands the attention kernels views
of the valid prefix; greedy, sampling, beam search (``reorder_cache``) and ``crop`` work.
``use_tile_cache(model)`` makes that model's ``generate`` build such a cache wherever it would
build its default ``DynamicCache`` (a cache passed by the caller or a ``cache_implementation``
still wins), and returns a callable that restores the default.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache
from transformers.masking_utils import (
    AttentionMaskInterface,
    causal_mask_function,
)

from tilegym.ops.attention import SUPPORTED_HEAD_DIMS, aligned_key_valid
from tilegym.ops.kv_cache import KVBuffer
from tilegym.ops.library import (
    decode_attention,
    decode_attention_sinks,
    prefill_attention,
    prefill_attention_sinks,
)

NAME = "tilegym"


class TilegymAttentionError(ValueError):
    """An attention call outside the envelope the cuTile kernels support."""


@dataclass(frozen=True)
class TileMask:
    """Compact attention mask: what the kernels need instead of a dense 4D tensor.

    Query row ``i`` may see key ``j`` when ``j <= i + q_start`` (if causal), ``j > i + q_start -
    window`` (if window) and ``key_valid[b, j]`` (if given). Under a static cache ``q_start`` is
    an int32 ``[1]`` device tensor (the first new token's cache index), so building the mask
    reads nothing on the host and a compiled decode step does not depend on the step.
    """

    q_length: int
    kv_length: int
    q_start: int | torch.Tensor
    causal: bool = True
    window: int | None = None
    key_valid: torch.Tensor | None = None


# ---------------------------------------------------------------------------------------------
# Mask builder
# ---------------------------------------------------------------------------------------------


def _probe(mask_function: Callable, q: int, n_kv: int) -> torch.Tensor:
    b = torch.zeros((1, 1, 1, 1), dtype=torch.long)
    h = torch.zeros((1, 1, 1, 1), dtype=torch.long)
    qi = torch.full((1, 1, 1, 1), q, dtype=torch.long)
    kv = torch.arange(n_kv, dtype=torch.long).view(1, 1, 1, -1)
    return torch.as_tensor(mask_function(b, h, qi, kv)).expand(1, 1, 1, n_kv).reshape(-1)


_PLAIN = (bool, int, float, str, type(None))
_FINGERPRINT_DEPTH = 8
_PATTERNS_MAX = 256
_patterns: dict[tuple, tuple[bool, int | None]] = {}


def _fingerprint(value, depth: int = 0):
    """A hashable stand-in for a pure mask function: its code and everything its closure and
    defaults hold (plain values, tuples of them, other such functions); None when it holds
    anything else (a tensor: its answers depend on data), so it cannot be recognized once for
    every call."""
    if depth > _FINGERPRINT_DEPTH:
        return None
    if isinstance(value, _PLAIN):
        return (type(value), value)
    if isinstance(value, (tuple, list)):
        parts = tuple(_fingerprint(v, depth + 1) for v in value)
        return None if None in parts else (type(value), parts)
    code = getattr(value, "__code__", None)
    if code is None:
        return None
    try:
        held = [cell.cell_contents for cell in value.__closure__ or ()]
    except ValueError:  # an empty cell
        return None
    parts = _fingerprint((*held, *(value.__defaults__ or ())), depth + 1)
    if parts is None:
        return None
    return (value.__module__, value.__qualname__, code, parts)


def recognize_pattern(mask_function: Callable, local_size: int | None) -> tuple[bool, int | None]:
    """(causal, window) of a transformers mask function, or raise when it is neither pattern.

    transformers builds a new mask function for every mask, and a static cache's decode step
    builds its mask eagerly, outside the compiled graph, once a token. Probing a window of
    ``local_size`` keys costs two rows of ``local_size`` keys (phi-3.5's 262144: 0.9-1.4 ms a
    call on the project's CPU test machine, against about 0.5 ms of attention kernels a decode
    step on the H200), so a recognized function is remembered by its fingerprint: same code,
    same captured values, same answer."""
    if mask_function is causal_mask_function:
        return True, None
    if torch.compiler.is_compiling():  # Dynamo cannot trace closure cells; probe as before
        return _probe_pattern(mask_function, local_size)
    key = _fingerprint(mask_function)
    if key is not None:
        key = (key, local_size)
        if key in _patterns:
            return _patterns[key]
    pattern = _probe_pattern(mask_function, local_size)
    if key is not None:
        if len(_patterns) >= _PATTERNS_MAX:
            _patterns.clear()
        _patterns[key] = pattern
    return pattern


def _probe_pattern(mask_function: Callable, local_size: int | None) -> tuple[bool, int | None]:
    if local_size is not None and local_size > 0:
        try:
            for q in (local_size + 5, 3):
                got = _probe(mask_function, q, q + 3)
                kv = torch.arange(q + 3)
                want = (kv <= q) & (kv > q - local_size)
                if not torch.equal(got.bool(), want):
                    break
            else:
                return True, local_size
        except Exception as exc:  # index-based probes fail on data-dependent mask functions
            raise TilegymAttentionError(
                f"tilegym attention: unsupported mask function ({exc})"
            ) from exc
    raise TilegymAttentionError(
        "tilegym attention supports causal and sliding-window causal masks (plus 2D padding); "
        f"got a custom mask function {getattr(mask_function, '__qualname__', mask_function)!r}"
    )


def _as_int(x) -> int:
    return int(x.item()) if isinstance(x, torch.Tensor) else int(x)


def device_position(mask) -> torch.Tensor | None:
    """The device-tensor ``q_start`` of a static-cache ``TileMask``, else None."""
    if isinstance(mask, TileMask) and isinstance(mask.q_start, torch.Tensor):
        return mask.q_start
    return None


def key_validity(
    attention_mask: torch.Tensor | None,
    kv_length: int,
    kv_offset: int,
    static: bool = False,
    read_device: bool = True,
) -> torch.Tensor | None:
    """Per-key validity ``[B, kv_length]`` (int8) from the 2D padding mask; None if all valid.

    ``static``: the cache holds ``kv_length`` slots of which the 2D mask covers the written
    ones; the causal bound already excludes the rest, so a mask with no padding gives None.
    While compiling, or with ``read_device`` off, the mask is always built: deciding reads
    device data on the host, a graph break when compiling and a device sync in eager mode."""
    if attention_mask is None:
        return None
    read_device = read_device and not torch.compiler.is_compiling()
    if static and read_device and bool(attention_mask.all()):
        return None
    pad = attention_mask.to(torch.bool)
    missing = kv_length + kv_offset - pad.shape[-1]
    if missing > 0:
        pad = torch.nn.functional.pad(pad, (0, missing))
    pad = pad[:, kv_offset : kv_offset + kv_length]
    if not static and read_device and bool(pad.all()):
        return None
    return aligned_key_valid(pad)


def tilegym_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset=0,
    kv_offset: int = 0,
    mask_function: Callable = causal_mask_function,
    attention_mask: torch.Tensor | None = None,
    local_size: int | None = None,
    use_vmap: bool = False,
    **kwargs,
) -> TileMask:
    """Mask builder registered in ``AttentionMaskInterface`` under "tilegym"."""
    if use_vmap:
        raise TilegymAttentionError(
            "tilegym attention does not support or/and mask functions (vmap masks)"
        )
    causal, window = recognize_pattern(mask_function, local_size)
    kv_offset = _as_int(kv_offset)
    static = isinstance(q_offset, torch.Tensor)
    if static and window is not None:  # a window sized by a full-length StaticLayer's device
        # counter. The sliding layers of transformers' static caches (StaticSlidingWindowLayer,
        # e.g. Gemma 3's) give host offsets instead and are described like a dynamic cache's.
        raise TilegymAttentionError(
            "tilegym attention does not support sliding-window layers of a static cache "
            "sized by a device position (a full-length StaticLayer)"
        )
    if static:  # transformers' StaticLayer: its length counter, a device tensor (copied here)
        start = q_offset - kv_offset if kv_offset else q_offset
        q_start = start.to(torch.int32, copy=True).reshape(1)
    else:
        q_start = _as_int(q_offset) - kv_offset
    # transformers turns the causal skip off exactly for a compileable cache's decode step. Its
    # mask never reads device data: that step may run in eager mode too (a graph break upstream,
    # e.g. transformers 5.17's longrope update), where each read would be a device sync.
    compileable_step = q_length == 1 and kwargs.get("allow_is_causal_skip") is False
    mask = TileMask(
        q_length=q_length,
        kv_length=kv_length,
        q_start=q_start,
        causal=causal,
        window=window,
        key_valid=key_validity(
            attention_mask, kv_length, kv_offset, static, read_device=not compileable_step
        ),
    )
    if not static and compileable_step:
        return compileable_decode_mask(mask, kv_offset, kwargs.get("device"))
    return mask


def compileable_decode_mask(mask: TileMask, kv_offset: int, device) -> TileMask:
    """A compileable (static) cache's decode-step mask with a host ``q_start`` (a
    ``StaticSlidingWindowLayer`` counts its fill on the host), given a device position.

    The host int changes every step, so the compiled decode step would take it as a symbolic
    input and its CUDA graph trees record a new graph per value (phi-3.5's 262144-token window:
    every step a recording, 25 tok/s against PyTorch's 172 on the H200). Such a layer's window
    cannot bind in a decode step (the query's cache index is the fill, below the window, or once
    full ``window - 1``) and is dropped, as the device-position decode path requires; a window
    that binds keeps the host offsets.

    The position is the token's absolute one (``q_start + kv_offset``): the patched layers keep
    these caches as ring buffers (``kv_cache_ring_write`` writes slot ``position % window``;
    decode attention sees every slot once the position passes the last), so the slots of a full
    window hold token ``t`` at ``t % window`` and the per-key validity is rotated to match."""
    if not mask.causal or (mask.window is not None and mask.q_start >= mask.window):
        return mask
    # a fill kernel with the value as its argument: ``torch.tensor([v], device=cuda)`` would copy
    # from pageable host memory, which waits for the stream (olmo3's cuTile side made 2.12
    # syncs a token on the H200 against PyTorch's 1.09, one pageable copy a token)
    position = torch.full((1,), mask.q_start + kv_offset, dtype=torch.int32, device=device)
    key_valid = mask.key_valid
    if key_valid is not None and kv_offset % mask.kv_length:
        key_valid = aligned_key_valid(torch.roll(key_valid, kv_offset % mask.kv_length, dims=-1))
    return dataclasses.replace(mask, q_start=position, window=None, key_valid=key_valid)


# ---------------------------------------------------------------------------------------------
# Attention function
# ---------------------------------------------------------------------------------------------

_UNSUPPORTED_KWARGS = ("softcap", "sinks", "position_bias")


def _describe_mask(
    module: torch.nn.Module, attention_mask, q_len: int, kv_len: int, is_causal: bool | None
) -> TileMask:
    if isinstance(attention_mask, TileMask):
        if attention_mask.kv_length != kv_len or attention_mask.q_length != q_len:
            raise TilegymAttentionError(
                f"tilegym mask is for q={attention_mask.q_length}, kv={attention_mask.kv_length} "
                f"but attention got q={q_len}, kv={kv_len}"
            )
        return attention_mask
    if attention_mask is not None:
        raise TilegymAttentionError(
            "tilegym attention takes no dense attention masks "
            f"(got {type(attention_mask).__name__} {tuple(getattr(attention_mask, 'shape', ()))}); "
            "build the model's masks through tilegym.transformers.attention.enable(model)"
        )
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = getattr(module, "sliding_window", None)
    return TileMask(q_len, kv_len, kv_len - q_len, causal=bool(causal), window=window)


def tilegym_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: returns ``([B, Sq, Hq, D], None)`` like sdpa; per-head
    sinks come as ``s_aux`` (``[Hq]``, gpt-oss) and run on the sink kernels."""
    if dropout:
        raise TilegymAttentionError(f"tilegym attention has no dropout (got p={dropout})")
    for name in _UNSUPPORTED_KWARGS:
        if kwargs.get(name) is not None:
            raise TilegymAttentionError(f"tilegym attention does not support `{name}`")
    groups = getattr(module, "num_key_value_groups", None)
    if groups is not None and query.shape[1] != key.shape[1] * groups:
        raise TilegymAttentionError(
            f"{query.shape[1]} query heads != {key.shape[1]} kv heads x {groups} groups"
        )
    sinks = kwargs.get("s_aux")
    if sinks is not None and tuple(sinks.shape) != (query.shape[1],):
        raise TilegymAttentionError(
            f"attention sinks of shape {tuple(sinks.shape)} for {query.shape[1]} query heads"
        )
    q_len, kv_len = query.shape[2], key.shape[2]
    mask = _describe_mask(module, attention_mask, q_len, kv_len, is_causal)
    if scaling is None:
        scaling = getattr(module, "scaling", None)
    position = device_position(mask)
    if position is not None and not (q_len == 1 and mask.causal):
        # a static cache's prefill (eager): read the start once
        mask, position = dataclasses.replace(mask, q_start=int(position[0])), None
    if q_len == 1 and (position is not None or not mask.causal or mask.q_start >= 0):
        if position is not None:  # keys [0, position], read on the device
            span = {"position": position}
        else:
            span = {"kv_end": min(kv_len, mask.q_start + 1) if mask.causal else kv_len}
        common = dict(scale=scaling, window=mask.window, key_valid=mask.key_valid, **span)
        if sinks is not None:
            out = decode_attention_sinks(query, key, value, sinks, **common)
        else:
            out = decode_attention(query, key, value, **common)
    else:
        common = dict(
            scale=scaling,
            causal=mask.causal,
            q_start=mask.q_start,
            window=mask.window,
            key_valid=mask.key_valid,
        )
        if sinks is not None:
            out = prefill_attention_sinks(query, key, value, sinks, **common)
        else:
            out = prefill_attention(query, key, value, **common)
    return out, None


# ---------------------------------------------------------------------------------------------
# Registration and per-model switch
# ---------------------------------------------------------------------------------------------


def register() -> None:
    """Register the attention function and mask builder under "tilegym" (idempotent)."""
    AttentionInterface.register(NAME, tilegym_attention_forward)
    AttentionMaskInterface.register(NAME, tilegym_mask)


def unsupported_reason(config) -> str | None:
    """Why the kernels cannot serve this model configuration, or None when they can.

    Checked before switching a model, so an unsupported model stays on its own attention with
    a reason instead of failing at its first forward."""
    if getattr(config, "kv_lora_rank", None):  # multi-head latent attention: ops/mla.py
        names = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
        bad = {n: getattr(config, n) for n in names if not _mla_width(getattr(config, n))}
        if bad:
            return (
                f"multi-head latent attention widths {bad}: the MLA kernels take powers of 2 >= 16"
            )
        return None
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads
    )
    if head_dim not in SUPPORTED_HEAD_DIMS:
        return f"head_dim {head_dim} is not supported (cuTile attention: {SUPPORTED_HEAD_DIMS})"
    if getattr(config, "use_bidirectional_attention", False):  # Gemma 3's non-causal variant
        return "bidirectional attention (config.use_bidirectional_attention) is not supported"
    return None


def _mla_width(w) -> bool:
    return isinstance(w, int) and w >= 16 and w & (w - 1) == 0


_MASK_FACTORIES = ("create_causal_mask", "create_sliding_window_causal_mask")


def pass_tile_masks(module) -> Callable[[], None]:
    """Make ``module``'s mask factories hand back a ``TileMask`` given as ``attention_mask``.

    For a static cache ``generate`` builds the masks before the compiled decode step, and some
    model forwards (Llama's) hand that prepared mask to ``create_causal_mask`` again, which
    passes through only 4D tensors and BlockMasks. The wrapper returns a TileMask as it is and
    calls the original for anything else. Installed once per module however many models are
    patched (reference counted); the returned callable takes one reference back."""
    undo = []
    for name in _MASK_FACTORIES:
        fn = getattr(module, name, None)
        if fn is None:
            continue
        if not hasattr(fn, "_tilegym_original"):
            fn = _tile_mask_passthrough(fn)
            setattr(module, name, fn)
        fn._tilegym_users += 1
        undo.append((name, fn))

    def restore() -> None:
        for name, fn in undo:
            fn._tilegym_users -= 1
            if fn._tilegym_users == 0 and getattr(module, name) is fn:
                setattr(module, name, fn._tilegym_original)
        undo.clear()

    return restore


def _tile_mask_passthrough(original: Callable) -> Callable:
    @functools.wraps(original)
    def create(*args, **kwargs):
        mask = kwargs.get("attention_mask", args[2] if len(args) > 2 else None)
        if isinstance(mask, TileMask):
            return mask
        return original(*args, **kwargs)

    create._tilegym_original = original
    create._tilegym_users = 0
    return create


def enable(model: torch.nn.Module) -> Callable[[], None]:
    """Switch this model instance to tilegym attention; return a callable undoing it."""
    reason = unsupported_reason(model.config)
    if reason:
        raise TilegymAttentionError(reason)
    register()
    old_config = model.config
    new_config = copy.deepcopy(old_config)
    owners = [m for m in model.modules() if getattr(m, "config", None) is old_config]
    for m in owners:
        m.config = new_config
    try:
        model.set_attn_implementation(NAME)
    except Exception:
        for m in owners:
            m.config = old_config
        raise

    def undo() -> None:
        for m in owners:
            if m.config is new_config:
                m.config = old_config

    return undo


# ---------------------------------------------------------------------------------------------
# KV cache
# ---------------------------------------------------------------------------------------------


class TileKVLayer(CacheLayerMixin):
    """Cache layer over a preallocated ``[B, Hkv, capacity, D]`` buffer (see ``KVBuffer``)."""

    is_sliding = False
    is_compileable = False
    is_croppable = True

    def __init__(self, capacity: int = 0, **kwargs):
        super().__init__()
        self.initial_capacity = capacity
        self.buffer: KVBuffer | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, s, d = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self.buffer = KVBuffer.allocate(
            b, h, max(self.initial_capacity, s), d, key_states.dtype, key_states.device
        )
        self._sync_views()
        self.is_initialized = True

    def _sync_views(self) -> None:
        n = self.buffer.length
        self.keys = self.buffer.keys[:, :, :n]
        self.values = self.buffer.values[:, :, :n]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = self.buffer.append(key_states, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return self.buffer.length if self.is_initialized else 0

    def get_max_length(self) -> int:
        return -1

    @property
    def capacity(self) -> int:
        return self.buffer.capacity if self.is_initialized else self.initial_capacity

    def reset(self) -> None:
        if self.is_initialized:
            self.buffer.length = 0
            self._sync_views()

    def crop(self, tokens_to_remove: int) -> None:
        if not self.is_initialized or tokens_to_remove == 0:
            return
        n = self.buffer.length
        keep = n + tokens_to_remove if tokens_to_remove < 0 else min(n, tokens_to_remove)
        self.buffer.length = max(0, keep)
        self._sync_views()

    def _select_batch(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        if self.is_initialized:
            self.buffer.keys = fn(self.buffer.keys).contiguous()
            self.buffer.values = fn(self.buffer.values).contiguous()
            self._sync_views()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._select_batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._select_batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._select_batch(lambda t: t[indices, ...])

    def offload(self):
        raise NotImplementedError("TileKVCache does not offload")

    def prefetch(self):
        return None


#: layer types whose cache holds conv / recurrent states instead of keys and values
#: (transformers' ``LinearAttentionLayer``, as its ``DynamicCache`` builds for them)
STATE_LAYER_TYPES = ("linear_attention", "conv")


class TileKVCache(Cache):
    """transformers ``Cache`` of ``TileKVLayer``s, one per decoder layer; a hybrid model's
    linear-attention layers (``layer_types``, Qwen3.5) get transformers' own state layer."""

    def __init__(
        self, num_layers: int, initial_capacity: int = 0, layer_types: list[str] | None = None
    ):
        from transformers.cache_utils import LinearAttentionLayer

        kinds = list(layer_types or ())[:num_layers]
        kinds += ["full_attention"] * (num_layers - len(kinds))
        super().__init__(
            layers=[
                LinearAttentionLayer()
                if kind in STATE_LAYER_TYPES
                else TileKVLayer(initial_capacity)
                for kind in kinds
            ]
        )


def make_cache(model: torch.nn.Module, batch_size: int, max_length: int) -> TileKVCache:
    """A cache for ``generate(past_key_values=...)`` preallocated for ``max_length`` tokens.

    Buffers are allocated on the first update with capacity ``max_length`` and the batch, dtype
    and device of the keys written then (``batch_size`` is checked, and ``generate`` may expand
    the batch, e.g. for ``num_return_sequences``); running past ``max_length`` doubles the
    capacity instead of failing.
    """
    if batch_size <= 0 or max_length <= 0:
        raise ValueError(f"batch_size and max_length must be positive ({batch_size}, {max_length})")
    cfg = model.config
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return TileKVCache(
        text_cfg.num_hidden_layers,
        initial_capacity=max_length,
        layer_types=getattr(text_cfg, "layer_types", None),
    )


CACHE_KWARGS = ("past_key_values", "cache")
"""Where ``generate`` keeps its cache: ``past_key_values`` in early 5.x, then ``cache``."""


def use_tile_cache(model: torch.nn.Module) -> Callable[[], None]:
    """Make ``model.generate`` use a ``TileKVCache`` where it would create a ``DynamicCache``.

    Instance-scoped (another model in the process keeps the default): the model's own
    ``_prepare_cache_for_generation`` runs first, and only a ``DynamicCache`` it created for an
    unset or ``"dynamic"`` ``cache_implementation`` is replaced, by one preallocated for the
    ``max_cache_length`` generate computed. Returns a callable that restores the default.

    A multi-head latent attention model (DeepSeek V2/V3: ``kv_lora_rank``) keeps its
    ``DynamicCache``: it caches a latent and a rope key of different widths per layer, and a
    ``TileKVLayer`` holds keys and values of one width.
    """
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else None
    if getattr(cfg or model.config, "kv_lora_rank", None):
        return lambda: None
    if "_prepare_cache_for_generation" in vars(model):
        raise TilegymAttentionError("this model's cache preparation is already replaced")
    original = model._prepare_cache_for_generation
    signature = inspect.signature(original)

    def prepare(*args, **kwargs):
        result = original(*args, **kwargs)
        arguments = signature.bind(*args, **kwargs).arguments
        config, model_kwargs = arguments["generation_config"], arguments["model_kwargs"]
        for key in CACHE_KWARGS:
            cache = model_kwargs.get(key)
            if (
                type(cache) is DynamicCache
                and not getattr(cache, "_is_user_defined", False)
                and config.cache_implementation in (None, "dynamic")
            ):
                model_kwargs[key] = make_cache(
                    model, arguments["batch_size"], arguments["max_cache_length"]
                )
        return result

    model._prepare_cache_for_generation = prepare

    def undo() -> None:
        if vars(model).get("_prepare_cache_for_generation") is prepare:
            del model._prepare_cache_for_generation

    return undo
