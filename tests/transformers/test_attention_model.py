"""tilegym attention inside small random-weight qwen3/llama models (real head configurations)."""

import copy
import inspect

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.cache_utils import DynamicCache, StaticCache
from transformers.masking_utils import (
    create_causal_mask,
    create_masks_for_generate,
    create_sliding_window_causal_mask,
)

from tilegym.ops.testing import rel_err
from tilegym.transformers.attention import (
    TilegymAttentionError,
    TileKVCache,
    TileMask,
    compileable_decode_mask,
    enable,
    make_cache,
    tilegym_attention_forward,
    tilegym_mask,
    use_tile_cache,
)

VOCAB = 512


def _config(model_key: str, tiny: bool = False, **extra):
    """Real head configuration (2 layers); ``tiny`` shrinks it for the CPU-only tests."""
    common = dict(
        vocab_size=VOCAB,
        num_hidden_layers=2,
        intermediate_size=128 if tiny else 1024,
        max_position_embeddings=4096,
        initializer_range=0.05,
        **extra,
    )
    if tiny:
        heads = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    elif model_key == "qwen3":
        heads = dict(hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128)
    else:
        heads = dict(hidden_size=1024, num_attention_heads=32, num_key_value_heads=8, head_dim=64)
    cfg = (Qwen3Config if model_key == "qwen3" else LlamaConfig)(**heads, **common)
    cfg._attn_implementation = "sdpa"
    return cfg


def _model(model_key: str, cfg=None, tiny: bool = True):
    cls = Qwen3ForCausalLM if model_key == "qwen3" else LlamaForCausalLM
    torch.manual_seed(0)
    return cls(cfg if cfg is not None else _config(model_key, tiny=tiny)).eval()


def _left_padded(lengths, gen=None, device="cpu"):
    total = max(lengths)
    ids = torch.randint(1, VOCAB, (len(lengths), total), generator=gen, device=device)
    mask = torch.zeros(len(lengths), total, dtype=torch.long, device=device)
    for i, n in enumerate(lengths):
        mask[i, total - n :] = 1
        ids[i, : total - n] = 0
    return ids, mask


# ------------------------------------------------------------------ CPU: registration, masks, cache


def test_enable_is_per_instance_even_with_a_shared_config():
    cfg = _config("qwen3", tiny=True)
    base, patched = _model("qwen3", cfg), _model("qwen3", cfg)
    assert base.config is patched.config
    undo = enable(patched)
    assert patched.config._attn_implementation == "tilegym"
    assert patched.model.layers[0].self_attn.config._attn_implementation == "tilegym"
    assert base.config._attn_implementation == "sdpa"
    assert base.model.layers[0].self_attn.config._attn_implementation == "sdpa"
    undo()
    assert patched.config is cfg and patched.config._attn_implementation == "sdpa"
    assert patched.model.layers[1].self_attn.config is cfg


def test_mask_builder_describes_left_padding_and_offsets():
    cfg = _config("llama", tiny=True)
    model = _model("llama", cfg)
    undo = enable(model)
    try:
        _, mask2d = _left_padded([6, 2])
        emb = torch.zeros(2, 6, 8)
        kwargs = dict(config=model.config, inputs_embeds=emb, attention_mask=mask2d)
        try:
            m = create_causal_mask(cache=None, **kwargs)
        except TypeError:  # transformers < 5.20 names it past_key_values
            m = create_causal_mask(past_key_values=None, **kwargs)
    finally:
        undo()
    assert isinstance(m, TileMask)
    assert (m.q_length, m.kv_length, m.q_start, m.causal, m.window) == (6, 6, 0, True, None)
    assert m.key_valid.tolist() == [[1] * 6, [0, 0, 0, 0, 1, 1]]


def test_mask_builder_recognizes_sliding_window_and_drops_all_valid_padding():
    cfg = _config(
        "qwen3", tiny=True, use_sliding_window=True, sliding_window=5, max_window_layers=0
    )
    model = _model("qwen3", cfg)
    undo = enable(model)
    try:
        emb = torch.zeros(1, 9, 8)
        kwargs = dict(config=model.config, inputs_embeds=emb, attention_mask=torch.ones(1, 9))
        try:
            m = create_sliding_window_causal_mask(cache=None, **kwargs)
        except TypeError:
            m = create_sliding_window_causal_mask(past_key_values=None, **kwargs)
    finally:
        undo()
    assert m.window == 5 and m.causal and m.key_valid is None


def _sliding_masks(window: int, fill: int, cache_cls, q_length: int = 1):
    """generate's masks (``create_masks_for_generate``, the masks a compiled decode step gets)
    for ``q_length`` new tokens after ``fill`` cached ones, written through ``cache.update``
    into a 16-token cache of ``cache_cls``; the sliding-window one."""
    cfg = _config(
        "qwen3", tiny=True, use_sliding_window=True, sliding_window=window, max_window_layers=0
    )
    model = _model("qwen3", cfg)
    undo = enable(model)
    try:
        if cache_cls is StaticCache:
            cache = StaticCache(config=model.config, max_cache_len=16)
        else:
            cache = DynamicCache(config=model.config)
        kv = torch.randn(1, 2, fill, 64)
        for layer_idx in range(cfg.num_hidden_layers):
            cache.update(kv, kv, layer_idx)
        kwargs = dict(
            config=model.config,
            inputs_embeds=torch.zeros(1, q_length, 64),
            attention_mask=torch.ones(1, fill + q_length, dtype=torch.long),
        )
        params = inspect.signature(create_masks_for_generate).parameters
        kwargs["cache" if "cache" in params else "past_key_values"] = cache
        masks = create_masks_for_generate(**kwargs)
    finally:
        undo()
    return masks["sliding_attention"] if isinstance(masks, dict) else masks


@pytest.mark.parametrize("window,fill", [(5, 3), (5, 9), (64, 2), (64, 15)])
def test_static_sliding_decode_masks_carry_a_device_position(window, fill):
    """A static cache's sliding layers count their fill on the host; their decode masks carry
    the token's absolute position as a device tensor (a compiled step then does not depend on
    the step; the ring-buffer write takes it modulo the window) and drop the window, which
    cannot bind: not yet full (3 of 5, or a 64-token window over a 16-token cache) or full."""
    mask = _sliding_masks(window, fill, StaticCache)
    assert isinstance(mask.q_start, torch.Tensor)
    assert mask.q_start.dtype == torch.int32 and mask.q_start.tolist() == [fill]
    assert mask.window is None and mask.causal and mask.q_length == 1


def test_a_full_ring_windows_key_validity_is_rotated_into_slot_order():
    """Slot ``t % 5`` holds token ``t``: the validity of tokens 7..11 (7 and 8 padding) moves to
    slots 2, 3, 4, 0, 1."""
    valid = torch.tensor([[0, 0, 1, 1, 1]], dtype=torch.int8)
    mask = TileMask(q_length=1, kv_length=5, q_start=4, window=5, key_valid=valid)
    ring = compileable_decode_mask(mask, kv_offset=7, device=torch.device("cpu"))
    assert ring.q_start.tolist() == [11] and ring.window is None
    assert ring.key_valid.tolist() == [[1, 1, 0, 0, 1]]


def test_other_masks_keep_host_offsets():
    """A prefill under a static cache, a dynamic cache's decode step and a decode step whose
    window binds keep their host offsets and window."""
    prefill = _sliding_masks(5, 3, StaticCache, q_length=4)
    assert isinstance(prefill.q_start, int) and prefill.window == 5
    dynamic = _sliding_masks(5, 9, DynamicCache)
    assert isinstance(dynamic.q_start, int) and dynamic.window == 5
    binding = TileMask(q_length=1, kv_length=12, q_start=11, window=5)
    assert compileable_decode_mask(binding, 0, torch.device("cpu")) is binding


class _ScalarReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts device-to-host scalar reads (``bool(t)``, ``t.item()``): each a sync on a GPU."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.reads += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("q_offset", [9, torch.tensor(9)], ids=["sliding", "static"])
def test_a_compileable_decode_steps_mask_reads_no_device_data(q_offset):
    """transformers 5.17's longrope update breaks the compiled decode step (phi-3.5), so the
    mask is built in eager mode every step: a host read of the padding mask there is a device
    sync per step. The mask is built without one, and still marks the padding."""
    padded = torch.ones(2, 10, dtype=torch.long)
    padded[1, :3] = 0
    for attention_mask in (torch.ones(2, 10, dtype=torch.long), padded):
        with _ScalarReads() as mode:
            mask = tilegym_mask(
                2,
                1,
                16,
                q_offset=q_offset,
                attention_mask=attention_mask,
                allow_is_causal_skip=False,
                device=torch.device("cpu"),
            )
        assert mode.reads == 0
        assert mask.key_valid[:, :10].tolist() == attention_mask.tolist()
    with _ScalarReads() as mode:  # a dynamic cache's step may read it, and skips an all-valid mask
        dynamic = tilegym_mask(2, 1, 10, q_offset=9, attention_mask=torch.ones(2, 10))
    assert dynamic.key_valid is None
    assert mode.reads == 1


def test_custom_mask_functions_are_rejected():
    def diagonal_only(b, h, q, kv):
        return kv == q

    with pytest.raises(TilegymAttentionError, match="custom mask function"):
        tilegym_mask(1, 4, 4, mask_function=diagonal_only)
    with pytest.raises(TilegymAttentionError, match="vmap"):
        tilegym_mask(1, 4, 4, use_vmap=True)


PROBES = {"calls": 0}


def _counted_window(b, h, q, kv, window=48):
    PROBES["calls"] += 1
    return (kv <= q) & (kv > q - window)


def test_a_window_mask_function_is_probed_once_per_fingerprint():
    """transformers builds a fresh mask function for every decode step's mask; probing a long
    window each time cost phi-3.5 about 0.9 ms of host time a token. Functions with the same
    code and captured values are recognized once."""
    from transformers.masking_utils import chunked_overlay, sliding_window_causal_mask_function

    from tilegym.transformers.attention import _fingerprint, recognize_pattern

    fresh = [sliding_window_causal_mask_function(w) for w in (512, 512, 1024)]
    assert fresh[0] is not fresh[1]
    assert _fingerprint(fresh[0]) == _fingerprint(fresh[1]) != _fingerprint(fresh[2])
    assert _fingerprint(chunked_overlay(4, torch.zeros(1, dtype=torch.long))) is None
    assert [recognize_pattern(f, w) for f, w in zip(fresh, (512, 512, 1024), strict=True)] == [
        (True, 512),
        (True, 512),
        (True, 1024),
    ]

    PROBES["calls"] = 0
    assert recognize_pattern(_counted_window, 48) == (True, 48)
    probed = PROBES["calls"]
    assert probed > 0
    assert recognize_pattern(_counted_window, 48) == (True, 48)
    assert PROBES["calls"] == probed  # remembered, not probed again
    with pytest.raises(TilegymAttentionError, match="custom mask function"):
        recognize_pattern(_counted_window, 32)  # another window is another question
    with pytest.raises(TilegymAttentionError, match="custom mask function"):
        recognize_pattern(sliding_window_causal_mask_function(256), 512)


def test_dense_masks_and_dropout_are_rejected_with_a_clear_error():
    module = torch.nn.Module()
    q = torch.zeros(1, 4, 3, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 3, 64, dtype=torch.bfloat16)
    with pytest.raises(TilegymAttentionError, match="no dense attention masks"):
        tilegym_attention_forward(module, q, k, k, torch.ones(1, 1, 3, 3, dtype=torch.bool))
    with pytest.raises(TilegymAttentionError, match="dropout"):
        tilegym_attention_forward(module, q, k, k, None, dropout=0.1)
    with pytest.raises(TilegymAttentionError, match="softcap"):
        tilegym_attention_forward(module, q, k, k, None, softcap=30.0)


def _cache_kwarg(model) -> str:
    """transformers renamed ``past_key_values`` to ``cache`` in 5.2x; use what this one takes."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _generate(model, ids, mask, n, cache=None, **kw):
    extra = {} if cache is None else {_cache_kwarg(model): cache}
    return model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=n,
        min_new_tokens=n,
        pad_token_id=0,
        **extra,
        **kw,
    )[:, ids.shape[1] :]


@pytest.mark.parametrize("lengths", [[5], [9, 4, 1]])
def test_tile_cache_generates_like_dynamic_cache_on_cpu(lengths):
    model = _model("llama")
    ids, mask = _left_padded(lengths)
    want = _generate(model, ids, mask, 24, do_sample=False)
    cache = make_cache(model, len(lengths), 8)  # forces two capacity doublings
    got = _generate(model, ids, mask, 24, cache=cache, do_sample=False)
    assert torch.equal(got, want)
    assert isinstance(cache, TileKVCache) and cache.get_seq_length() == ids.shape[1] + 23
    assert cache.layers[0].capacity >= cache.get_seq_length()
    cache.crop(-5)
    assert cache.get_seq_length() == ids.shape[1] + 18
    assert cache.layers[1].keys.shape[2] == ids.shape[1] + 18


def test_tile_cache_supports_beam_search_on_cpu():
    model = _model("llama")
    ids, mask = _left_padded([6, 3])
    want = _generate(model, ids, mask, 6, num_beams=2, do_sample=False)
    got = _generate(model, ids, mask, 6, cache=make_cache(model, 4, 16), num_beams=2)
    assert torch.equal(got, want)


def _generate_dict(model, ids, mask, **kw):
    with torch.inference_mode():
        return model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=7,
            do_sample=False,
            pad_token_id=0,
            return_dict_in_generate=True,
            **kw,
        )


def test_use_tile_cache_replaces_only_the_default_dynamic_cache_of_that_model():
    from transformers import DynamicCache, StaticCache

    model, other = _model("qwen3"), _model("qwen3")
    ids, mask = _left_padded([9, 4])
    want = _generate_dict(model, ids, mask)
    undo = use_tile_cache(model)
    got = _generate_dict(model, ids, mask)
    assert torch.equal(got.sequences, want.sequences)
    assert isinstance(got.past_key_values, TileKVCache)
    assert got.past_key_values.layers[0].capacity >= ids.shape[1] + 6
    assert type(_generate_dict(other, ids, mask).past_key_values) is DynamicCache
    mine = DynamicCache(config=model.config)
    assert _generate_dict(model, ids, mask, past_key_values=mine).past_key_values is mine
    static = _generate_dict(model, ids, mask, cache_implementation="static").past_key_values
    assert isinstance(static, StaticCache)
    with pytest.raises(TilegymAttentionError, match="already replaced"):
        use_tile_cache(model)
    undo()
    assert "_prepare_cache_for_generation" not in vars(model)
    assert type(_generate_dict(model, ids, mask).past_key_values) is DynamicCache


# ------------------------------------------------------------------ GPU: logits and generate()

MODELS = ["qwen3", "llama"]


@pytest.fixture(scope="module")
def gpu_models():
    """model key -> (fp32 sdpa reference, bf16 sdpa baseline, bf16 tilegym) sharing weights."""
    out = {}
    for key in MODELS:
        cfg = _config(key)
        ref = _model(key, cfg).to("cuda", torch.float32)
        base = copy.deepcopy(ref).to(torch.bfloat16)
        tile = copy.deepcopy(ref).to(torch.bfloat16)
        tile.config = base.config  # same config object, as from_config would share it
        for m in tile.modules():
            if hasattr(m, "config") and m is not tile:
                m.config = base.config
        enable(tile)
        out[key] = (ref, base, tile)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("model_key", MODELS)
def test_teacher_forced_logits_within_bf16_error(model_key, gpu_models):
    ref, base, tile = gpu_models[model_key]
    assert base.config._attn_implementation == "sdpa"
    assert tile.config._attn_implementation == "tilegym"
    gen = torch.Generator(device="cuda").manual_seed(1)
    ids, mask = _left_padded([300, 257, 100, 17], gen, device="cuda")
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits
        got_base = base(input_ids=ids, attention_mask=mask).logits
        got_tile = tile(input_ids=ids, attention_mask=mask).logits
    valid = mask.bool()
    err_base = rel_err(got_base[valid], want[valid])
    err_tile = rel_err(got_tile[valid], want[valid])
    print(f"{model_key}: logits rel err tilegym {err_tile:.3e} vs bf16 sdpa {err_base:.3e}")
    assert 0 < err_tile <= 1.5 * err_base
    assert rel_err(torch.zeros_like(got_tile[valid]), want[valid]) > 1.5 * err_base


def _agreement(a, b):
    """Per sequence: number of leading tokens on which two generations agree."""
    same = (a == b).int().cumprod(dim=1)
    return same.sum(dim=1).tolist()


def _near_tie(ref, base, prefix, tok_a, tok_b) -> bool:
    """Whether the fp32 model rates both next tokens as top within the bf16 model's logit error.

    Greedy decoding of two bf16 models may part ways where the two best logits are closer
    than bf16 rounding; that is a tie, not a kernel error.
    """
    with torch.no_grad():
        exact = ref(input_ids=prefix[None]).logits[0, -1].float()
        noisy = base(input_ids=prefix[None]).logits[0, -1].float()
    noise = (noisy - exact).abs().max()
    top = exact.max()
    return bool(top - exact[tok_a] <= 2 * noise and top - exact[tok_b] <= 2 * noise)


@pytest.mark.gpu
@pytest.mark.parametrize("model_key", MODELS)
@pytest.mark.parametrize("lengths", [[37], [200, 150, 99, 64, 33, 17, 5, 1]])
def test_greedy_generate_matches_pytorch_bf16(model_key, lengths, gpu_models):
    ref, base, tile = gpu_models[model_key]
    gen = torch.Generator(device="cuda").manual_seed(len(lengths))
    ids, mask = _left_padded(lengths, gen, device="cuda")
    with torch.no_grad():
        want = _generate(base, ids, mask, 256, do_sample=False)
        got = _generate(tile, ids, mask, 256, do_sample=False)
        cached = _generate(
            tile, ids, mask, 256, cache=make_cache(tile, len(lengths), 64), do_sample=False
        )
    agree = _agreement(got, want)
    print(f"{model_key} batch {len(lengths)}: leading tokens equal to bf16 sdpa: {agree}")
    for i, p in enumerate(agree):
        if p < want.shape[1]:  # where they part, the fp32 model must call it a tie
            prefix = torch.cat([ids[i][mask[i].bool()], want[i, :p]])
            assert _near_tie(ref, base, prefix, want[i, p], got[i, p]), (i, p)
    assert base.config._attn_implementation == "sdpa"
    # the preallocated cache (grown past its 64 slots) gives the very same tokens
    assert torch.equal(cached, got)


@pytest.mark.gpu
@pytest.mark.parametrize("model_key", MODELS)
def test_sampling_with_tile_cache_matches_dynamic_cache(model_key, gpu_models):
    _, _, tile = gpu_models[model_key]
    gen = torch.Generator(device="cuda").manual_seed(7)
    ids, mask = _left_padded([40, 12, 25], gen, device="cuda")
    kw = dict(do_sample=True, top_k=50, temperature=0.9)
    with torch.no_grad():
        torch.manual_seed(3)
        want = _generate(tile, ids, mask, 40, **kw)
        torch.manual_seed(3)
        got = _generate(tile, ids, mask, 40, cache=make_cache(tile, 3, 128), **kw)
    assert torch.equal(got, want)
    assert got.min() >= 0 and got.max() < VOCAB
