"""CPU tests of the patch framework: dispatch, version refusal, flag reporting, undo."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

import tilegym.transformers
from tilegym.transformers import monkey_patch as mp

FAMILIES = ["qwen3", "llama", "mistral", "qwen2", "phi3", "gemma3"]


def tiny_model(model_type: str, head_dim: int = 16):
    """The bundled small config with 1 layer and narrow dims: real classes, CPU-cheap."""
    path = Path(tilegym.transformers.__file__).parent / model_type / "small_config.json"
    d = json.loads(path.read_text())
    d.update(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
    d.update(head_dim=head_dim, num_hidden_layers=1, vocab_size=128)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(**d))


def upstream_classes(model_type: str) -> dict[str, type]:
    desc = mp.FAMILIES[model_type].description()
    up = __import__(desc.upstream_module, fromlist=["_"])
    return {
        p: getattr(up, desc.class_prefix + p)
        for p in ("RMSNorm", "MLP", "Attention", "DecoderLayer")
    }


@pytest.mark.parametrize("version", ["5.17.0", "5.24.0", "5.99.1", "5.30.0.dev0"])
def test_supported_versions(version):
    assert mp.transformers_version_error(version) is None


@pytest.mark.parametrize("version", ["4.57.1", "5.16.2", "6.0.0", "not-a-version"])
def test_unsupported_versions_have_a_clear_reason(version):
    reason = mp.transformers_version_error(version)
    assert reason and version in reason


def test_installed_version_is_accepted():
    mp.check_transformers_version()


def test_dispatch_refuses_unknown_model_type_and_lists_supported():
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(
        mp.UnsupportedModelType,
        match="gpt2.*supported: deepseek_v2, deepseek_v3, gemma3_text, gpt_oss, granite, llama, "
        "mistral, mixtral, olmo2, olmo3, olmoe, phi3, qwen2, qwen3, qwen3_5_text, qwen3_moe, "
        "qwen3_next, smollm3",
    ):
        mp.apply_tilegym_kernel(model)


def test_dispatch_rejects_unknown_flags():
    with pytest.raises(TypeError, match="unknown patch flags"):
        mp.apply_tilegym_kernel(tiny_model("qwen3"), fused_everything=True)


@pytest.mark.parametrize("heads", [-1, 65, 1.0, "2", True])
def test_rope_heads_must_be_a_small_int(heads):
    with pytest.raises(ValueError, match="rope_heads must be an int in 0..64"):
        mp.apply_tilegym_kernel(tiny_model("qwen3"), rope_heads=heads)
    with pytest.raises(ValueError, match="rope_heads must be an int in 0..64"):
        mp.apply_tilegym_kernel_to_llama(model=tiny_model("llama"), rope_heads=heads)


@pytest.mark.parametrize("value", [-1, 3, 1.0, "1", True])
def test_norm_gemv_must_be_0_1_or_2(value):
    with pytest.raises(ValueError, match="norm_gemv must be 0, 1 or 2"):
        mp.apply_tilegym_kernel(tiny_model("qwen3"), norm_gemv=value)
    with pytest.raises(ValueError, match="norm_gemv must be 0, 1 or 2"):
        mp.apply_tilegym_kernel_to_llama(model=tiny_model("llama"), norm_gemv=value)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_dispatch_uses_config_model_type(model_type):
    model = tiny_model(model_type)
    handle = mp.apply_tilegym_kernel(model, attn=False, linear=False)
    try:
        assert handle.model_type == mp.FAMILIES[model_type].model_type
        assert handle.applied == ["rope", "rms_norm", "swiglu"]
        assert handle.not_applied == {
            "attn": "disabled by the caller",
            "linear": "disabled by the caller",
        }
    finally:
        handle.undo()


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_flag_is_reported(model_type):
    model = tiny_model(model_type)
    handle = mp.apply_tilegym_kernel(model)
    try:
        assert set(handle.applied) | set(handle.not_applied) == set(mp.FLAGS)
        assert not set(handle.applied) & set(handle.not_applied)
        assert all(handle.not_applied.values())
    finally:
        handle.undo()


def test_missing_optional_module_is_a_reason_not_a_crash():
    mod, reason = mp.optional_module("tilegym.ops.no_such_kernel_module", ("linear",))
    assert mod is None and "not importable" in reason
    mod, reason = mp.optional_module("tilegym.ops.rms_norm", ("linear",))
    assert mod is None and "lacks linear" in reason


def test_non_silu_activation_is_reported():
    model = tiny_model("llama")
    model.config.hidden_act = "gelu"
    handle = mp.apply_tilegym_kernel(model, attn=False, linear=False)
    try:
        assert "swiglu" not in handle.applied
        assert "gelu" in handle.not_applied["swiglu"]
    finally:
        handle.undo()


@pytest.mark.parametrize("model_type", FAMILIES)
def test_instance_patch_leaves_other_instances_and_undo_restores(model_type):
    patched, other = tiny_model(model_type), tiny_model(model_type)
    classes = upstream_classes(model_type)
    handle = mp.apply_tilegym_kernel(patched, attn=False, linear=False)
    layer = patched.model.layers[0]
    for mod in (layer, layer.self_attn, layer.mlp, layer.input_layernorm, patched.model.norm):
        assert "forward" in mod.__dict__
    assert all("forward" not in m.__dict__ for m in other.modules())
    assert all(classes[p].forward is classes[p].__dict__["forward"] for p in classes)
    handle.undo()
    assert all("forward" not in m.__dict__ for m in patched.modules())
    handle.undo()  # idempotent


@pytest.mark.parametrize("model_type", FAMILIES)
def test_class_patch_undo_restores_exact_function_objects(model_type):
    classes = upstream_classes(model_type)
    originals = {p: c.__dict__["forward"] for p, c in classes.items()}
    apply = getattr(mp, f"apply_tilegym_kernel_to_{model_type}")
    handle = apply(attn=True, linear=False)
    try:
        assert all(c.__dict__["forward"] is not originals[p] for p, c in classes.items())
        assert "needs" in handle.not_applied["attn"] or "per model" in handle.not_applied["attn"]
        model = tiny_model(model_type)  # instantiated after the class patch: gets the new forward
        assert model.model.layers[0].mlp.forward.__func__ is classes["MLP"].__dict__["forward"]
    finally:
        handle.undo()
    assert all(c.__dict__["forward"] is originals[p] for p, c in classes.items())


def test_double_patch_is_refused():
    model = tiny_model("qwen3")
    handle = mp.apply_tilegym_kernel(model, attn=False, linear=False)
    try:
        with pytest.raises(mp.AlreadyPatched):
            mp.apply_tilegym_kernel(model, attn=False, linear=False)
        assert "forward" in model.model.layers[0].__dict__  # the failed call undid only itself
    finally:
        handle.undo()


def test_attention_setting_restored_on_undo():
    model = tiny_model("llama", head_dim=64)
    before = model.config._attn_implementation
    handle = mp.apply_tilegym_kernel(model, linear=False)
    assert "attn" in handle.applied, handle.not_applied
    assert model.model.layers[0].self_attn.config._attn_implementation == "tilegym"
    handle.undo()
    assert model.model.layers[0].self_attn.config._attn_implementation == before


def test_linear_repacks_weights_once_and_undo_frees_them():
    model = tiny_model("llama")
    handle = mp.apply_tilegym_kernel(model, attn=False)
    if "linear" not in handle.applied:
        handle.undo()
        pytest.skip(f"linear not applied: {handle.not_applied['linear']}")
    desc = mp.FAMILIES["llama"].description()
    attn = model.model.layers[0].self_attn
    fused = handle.repacked
    assert len(fused) == 2 * len(model.model.layers)  # QKV and gate+up, at patch time
    w, _ = fused.get(attn, desc.qkv)
    expect = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    assert torch.equal(w, expect)
    handle.undo()
    assert len(fused) == 0
    assert not any("_tilegym_fused" in name for m in model.modules() for name in vars(m))


def test_config_copy_keeps_models_independent():
    a = tiny_model("qwen3")
    b = AutoModelForCausalLM.from_config(copy.deepcopy(a.config))
    handle = mp.apply_tilegym_kernel(a, linear=False)
    try:
        assert b.config._attn_implementation != "tilegym"
    finally:
        handle.undo()


@pytest.mark.parametrize("model_type", FAMILIES)
def test_glue_with_pytorch_routes_matches_upstream(model_type):
    """The patched forwards' plumbing (cache API of this release, kwargs, residual folding),
    with every route on PyTorch, reproduces upstream logits and cached greedy decoding."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    torch.manual_seed(0)
    base = tiny_model(model_type).eval()
    glued = AutoModelForCausalLM.from_config(copy.deepcopy(base.config)).eval()
    glued.load_state_dict(base.state_dict())
    glue, desc = mp.FAMILIES[model_type].glue(), mp.FAMILIES[model_type].description()
    classes = upstream_classes(model_type)
    routes = glue.Routes()
    fused = glue.FusedWeights()
    up = __import__(desc.upstream_module, fromlist=["_"])
    takes = glue.cache_update_takes_kwargs(classes["Attention"])
    fns = {
        "MLP": glue.make_mlp_forward(routes, fused, None, desc),
        "Attention": glue.make_attention_forward(
            routes, fused, None, up.eager_attention_forward, ALL_ATTENTION_FUNCTIONS, takes, desc
        ),
        "DecoderLayer": glue.make_decoder_layer_forward(routes, desc),
    }
    for m in glued.modules():
        for part, fn in fns.items():
            if isinstance(m, classes[part]):
                m.forward = fn.__get__(m)
    ids = torch.randint(1, 128, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(glued(input_ids=ids).logits, base(input_ids=ids).logits)
        kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
        assert torch.equal(glued.generate(ids[:1], **kw), base.generate(ids[:1], **kw))


@pytest.mark.parametrize("model_type", FAMILIES)
def test_unsupported_head_dim_leaves_attention_alone_with_a_reason(model_type):
    model = tiny_model(model_type, head_dim=16)
    before = model.config._attn_implementation
    handle = mp.apply_tilegym_kernel(model, linear=False)
    assert "attn" not in handle.applied
    assert "head_dim 16" in handle.not_applied["attn"]
    assert model.config._attn_implementation == before
    handle.undo()


def test_tile_kv_cache_follows_the_attention_patch_and_is_undone():
    """Both families opt in (their experiments kept it): with cuTile attention applied to an
    instance, generate() builds a TileKVCache; undo restores transformers' default."""
    for model_type in FAMILIES:
        model = tiny_model(model_type, head_dim=64)
        handle = mp.apply_tilegym_kernel(model, linear=False)
        assert "_prepare_cache_for_generation" in vars(model)
        handle.undo()
        assert "_prepare_cache_for_generation" not in vars(model)

    no_attn = tiny_model("llama", head_dim=16)  # head_dim 16: cuTile attention not applied
    handle = mp.apply_tilegym_kernel(no_attn, linear=False)
    mp.use_tile_kv_cache(handle, no_attn)
    assert "_prepare_cache_for_generation" not in vars(no_attn)
    handle.undo()
    mp.use_tile_kv_cache(mp.PatchHandle("llama", applied=["attn"]), None)  # class level: no-op


_FALLBACKS_CHECK = """
import torch
from torch._inductor import lowering
from tilegym.ops import library
ops = [op._opoverload for op in library._OPS]
before = sum(op in lowering.lowerings for op in ops)
from tests.transformers.test_patch_framework import tiny_model
from tilegym.transformers import monkey_patch as mp
mp.apply_tilegym_kernel(tiny_model("qwen3"))
print(len(ops), before, sum(op in lowering.lowerings for op in ops))
"""


@pytest.mark.slow
def test_the_patch_gives_inductor_every_ops_fallback_before_it_compiles():
    """torch 2.11 prints an op's whole IR argument tree before creating its implicit fallback
    (gemma-3-1b's decode step: over 300 s on the H200 host); applying the patch registers the
    fallbacks first. A fresh interpreter, so no earlier compile has registered them."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", _FALLBACKS_CHECK],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    total, before, after = map(int, done.stdout.split()[-3:])
    assert total >= 18 and before == 0 and after == total
