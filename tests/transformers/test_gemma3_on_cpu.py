"""The gemma3 family (Gemma 3 text model, ``gemma3_text``) patched on the CPU against upstream.

A tiny model at the attention kernels' head size with both layer types (sliding-window layers
with a window shorter than the prompts, a full-attention layer), randomized norm weights (Gemma
initializes its ``1 + weight`` norms at zero) and a ``query_pre_attn_scalar`` other than the
head dim. On the CPU the cuTile ops run their PyTorch implementations, so these tests check the
glue: every flag and combination reproduces upstream's logits and greedy tokens on a
left-padded batch, each layer gets its layer type's RoPE table, caches (TileKVCache, static)
and undo behave, and what stays unsupported is reported, not run.
"""

from __future__ import annotations

import copy
import types

import pytest
import torch
from cpu_generate import greedy, left_padded_batch
from transformers import AutoConfig, AutoModelForCausalLM

from tilegym.transformers import monkey_patch as mp
from tilegym.transformers.attention import TileKVCache

TINY = dict(
    hidden_size=128,
    intermediate_size=192,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    query_pre_attn_scalar=48,
    vocab_size=256,
    sliding_window=4,
    sliding_window_pattern=2,  # sliding, full, sliding
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def _model(**extra):
    config = AutoConfig.for_model("gemma3_text", **{**TINY, **extra})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norm weights start at zero: make the (1 + weight) scale count
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0, 0.5)
    return model


def _greedy(model, ids, mask, **kw):
    return greedy(model, ids, mask, new_tokens=8, **kw)


def _logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


FLAG_SETS = {"all": dict.fromkeys(mp.FLAGS, True)}
FLAG_SETS |= {f"only-{f}": {g: g == f for g in mp.FLAGS} for f in mp.FLAGS}
FLAG_SETS |= {f"no-{f}": {g: g != f for g in mp.FLAGS} for f in mp.FLAGS}


@pytest.mark.parametrize("flags", list(FLAG_SETS))
def test_every_flag_set_reproduces_upstream(flags):
    base = _model()
    patched = copy.deepcopy(base)
    handle = mp.apply_tilegym_kernel(patched, **FLAG_SETS[flags])
    assert handle.model_type == "gemma3_text"
    assert handle.applied == [f for f, on in FLAG_SETS[flags].items() if on], handle.not_applied
    ids, mask = left_padded_batch((0, 4, 9), seed=1, low=3)
    valid = mask.bool()
    want = _logits(base, ids, mask)
    torch.testing.assert_close(_logits(patched, ids, mask)[valid], want[valid])
    assert torch.equal(_greedy(patched, ids, mask), _greedy(base, ids, mask))


def test_the_patch_routes_through_the_gemma3_ops():
    """With every flag the layers run the (1 + weight) norms, the fused norm-add kernels, the
    GELU-tanh gate-up GEMM and the q/k-norm + RoPE op (their custom ops, on the CPU)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: dict[str, list] = {}

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            if func.namespace == "tilegym":
                seen.setdefault(func._opname, []).append(args)
            return func(*args, **(kwargs or {}))

    model = _model()
    handle = mp.apply_tilegym_kernel(model)
    ids, mask = left_padded_batch((0, 4, 9), seed=1, low=3)
    with Spy():
        _logits(model, ids, mask)
    layers = model.config.num_hidden_layers
    assert len(seen["rms_norm"]) == layers + 1  # input norms and the final norm
    assert all(args[-1] is True for args in seen["rms_norm"])  # Gemma's form
    assert len(seen["rms_norm_add_rms_norm"]) == len(seen["rms_norm_add"]) == layers
    assert len(seen["fused_gate_up_gelu_tanh"]) == len(seen["qk_norm_rope"]) == layers
    assert all(args[-1] is True for args in seen["qk_norm_rope"])
    assert len(seen["prefill_attention"]) == layers
    windows = [args[6] for args in seen["prefill_attention"]]  # sliding, full, sliding
    assert windows == [4, None, 4]
    assert "silu_and_mul" not in seen and "fused_gate_up_silu" not in seen
    handle.undo()


def test_each_layer_gets_its_layer_types_rope_table():
    """Sliding-window layers rotate with the local table (base 1e4), full-attention layers with
    the global one (1e6), as upstream hands them to each layer."""
    model = _model()
    handle = mp.apply_tilegym_kernel(model)
    got = {}

    def spy(index):
        def hook(module, args, kwargs):
            got[index] = kwargs["position_embeddings"]

        return hook

    hooks = [
        layer.self_attn.register_forward_pre_hook(spy(i), with_kwargs=True)
        for i, layer in enumerate(model.model.layers)
    ]
    ids = torch.randint(3, 256, (1, 9))
    _logits(model, ids, torch.ones_like(ids))
    for h in hooks:
        h.remove()
    pos = torch.arange(9)[None]
    x = model.model.embed_tokens(ids)
    tables = {t: model.model.rotary_emb(x, pos, t) for t in ("sliding_attention", "full_attention")}
    assert not torch.allclose(tables["sliding_attention"][1], tables["full_attention"][1])
    for i, layer_type in enumerate(model.config.layer_types):
        for a, b in zip(got[i], tables[layer_type], strict=True):
            assert torch.equal(a, b), (i, layer_type)
    handle.undo()


def test_undo_restores_upstream_bit_for_bit():
    base = _model()
    patched = copy.deepcopy(base)
    before = patched.config._attn_implementation
    handle = mp.apply_tilegym_kernel(patched)
    ids, mask = left_padded_batch((0, 4, 9), seed=1, low=3)
    _greedy(patched, ids, mask)  # run it (caches, repacked weights) before undoing
    handle.undo()
    assert torch.equal(_logits(patched, ids, mask), _logits(base, ids, mask))
    assert torch.equal(_greedy(patched, ids, mask), _greedy(base, ids, mask))
    assert all("forward" not in vars(m) for m in patched.modules())
    assert not any("_tilegym_fused" in k for m in patched.modules() for k in vars(m))
    assert patched.config._attn_implementation == before
    assert "_prepare_cache_for_generation" not in vars(patched)


def test_class_level_patch_uses_the_familys_activation_and_undoes():
    """Without an instance the family's GELU-tanh kernels are used (no config to read)."""
    from transformers.models.gemma3 import modeling_gemma3 as up

    classes = [up.Gemma3RMSNorm, up.Gemma3MLP, up.Gemma3Attention, up.Gemma3DecoderLayer]
    originals = [c.__dict__["forward"] for c in classes]
    ids, mask = left_padded_batch((0, 4, 9), seed=1, low=3)
    valid = mask.bool()
    want = _logits(_model(), ids, mask)  # before the patch: it changes the classes
    handle = mp.apply_tilegym_kernel_to_gemma3(attn=False)
    try:
        assert "swiglu" in handle.applied
        patched = _model()
        assert type(patched.model.layers[0].mlp).forward is not originals[1]
        torch.testing.assert_close(_logits(patched, ids, mask)[valid], want[valid])
    finally:
        handle.undo()
    assert [c.__dict__["forward"] for c in classes] == originals
    assert torch.equal(_logits(_model(), ids, mask), want)


def test_generate_uses_the_tile_kv_cache_and_matches():
    base = _model()
    patched = copy.deepcopy(base)
    mp.apply_tilegym_kernel(patched)
    ids, mask = left_padded_batch((0, 4, 9), seed=1, low=3)
    with torch.no_grad():
        out = patched.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=8,
            min_new_tokens=8,
            do_sample=False,
            pad_token_id=0,
            return_dict_in_generate=True,
        )
    assert isinstance(out.past_key_values, TileKVCache)
    assert torch.equal(out.sequences[:, ids.shape[1] :], _greedy(base, ids, mask))


def test_an_eager_static_cache_matches_dynamic_generation():
    """transformers' static cache: the full layer is written in place at the device position,
    the sliding layers keep their rolling StaticSlidingWindowLayer (window 4 < prompt)."""
    base = _model()
    patched = copy.deepcopy(base)
    mp.apply_tilegym_kernel(patched)
    ids, mask = left_padded_batch((0, 4, 9), seed=1, low=3)
    want = _greedy(base, ids, mask)
    assert torch.equal(_greedy(patched, ids, mask, cache_implementation="static"), want)


@pytest.mark.parametrize("field", ["final_logit_softcapping", "attn_logit_softcapping"])
def test_soft_capping_is_reproduced_where_upstream_applies_it(field):
    """Gemma 3 applies the final soft-capping after lm_head in its own forward (kept) and never
    passes the attention soft-capping to its attention: the patched model matches upstream
    (the family probe still refuses attention soft-capping by name for new families)."""
    base = _model(**{field: 5.0})
    patched = copy.deepcopy(base)
    handle = mp.apply_tilegym_kernel(patched)
    assert handle.applied == list(mp.FLAGS), handle.not_applied
    ids, mask = left_padded_batch((0, 4, 9), seed=1, low=3)
    valid = mask.bool()
    want = _logits(base, ids, mask)
    if field == "final_logit_softcapping":
        assert want.abs().max() <= 5.0
    torch.testing.assert_close(_logits(patched, ids, mask)[valid], want[valid])


def test_bidirectional_attention_keeps_pytorch_attention_with_a_reason():
    base = _model(use_bidirectional_attention=True)
    patched = copy.deepcopy(base)
    handle = mp.apply_tilegym_kernel(patched)
    assert "bidirectional" in handle.not_applied["attn"]
    assert handle.applied == ["rope", "rms_norm", "swiglu", "linear"]
    ids = torch.randint(3, 256, (2, 9))
    mask = torch.ones_like(ids)
    torch.testing.assert_close(_logits(patched, ids, mask), _logits(base, ids, mask))


def test_another_activation_is_not_routed_to_the_gelu_kernels():
    model = _model()
    model.config.hidden_activation = "gelu"
    handle = mp.apply_tilegym_kernel(model, attn=False)
    assert "swiglu" not in handle.applied
    assert "'gelu'" in handle.not_applied["swiglu"]
    handle.undo()


def test_head_dim_256_gets_cutile_attention():
    """gemma-3-1b's head_dim 256 is in the attention kernels' envelope (their forward is
    checked against PyTorch on a GPU: tests/transformers/test_patch_models.py)."""
    patched = _model(head_dim=256, query_pre_attn_scalar=256)
    handle = mp.apply_tilegym_kernel(patched)
    assert "attn" in handle.applied and "attn" not in handle.not_applied
    handle.undo()


def test_the_multimodal_gemma3_model_type_is_not_patched():
    """The folder gemma3 patches the text model only (``MODEL_TYPE``)."""
    model = types.SimpleNamespace(config=types.SimpleNamespace(model_type="gemma3"))
    with pytest.raises(mp.UnsupportedModelType, match="'gemma3'.*gemma3_text"):
        mp.apply_tilegym_kernel(model)
    assert mp.FAMILIES["gemma3"].model_type == "gemma3_text"
    assert mp.APPLY_BY_MODEL_TYPE["gemma3_text"] is mp.apply_tilegym_kernel_to_gemma3
