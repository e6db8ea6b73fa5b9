"""The family probe: registered families are described as they are registered, and families
the ops do not cover are refused by name (structure, config or numbers)."""

from __future__ import annotations

import copy
import dataclasses
import importlib

import cpu_generate
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tilegym.transformers import monkey_patch as mp
from tilegym.transformers.family_probe import (
    FamilyRefused,
    config_problems,
    describe_structure,
    norm_form,
    norm_rounds_once,
    verify,
)

SMALL = dict(cpu_generate.SMALL, num_hidden_layers=2)


def _tiny(model_type: str, **extra):
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{**SMALL, **extra})
    return AutoModelForCausalLM.from_config(config).eval()


#: per model type, what makes the tiny model show its features to the numeric check (Gemma 3:
#: a sliding-window layer, its window shorter than the probe's prompts, then a global layer;
#: Granite: every muP scale off its default; SmolLM3: 4 layers, the 4th without RoPE and, with
#: the window on, a sliding-window layer)
FEATURES = {
    "gemma3_text": dict(sliding_window_pattern=2, sliding_window=4),
    "granite": dict(
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        attention_multiplier=0.1,
        logits_scaling=8.0,
    ),
    "smollm3": dict(num_hidden_layers=4, use_sliding_window=True, sliding_window=4),
    # OLMo 3: one layer_types period (three sliding-window layers, one full); OLMoE: its q norm
    # spans hidden_size, so the heads fill it, and q/k/v clipped; Mixtral: a window
    "olmo3": dict(num_hidden_layers=4, sliding_window=4),
    "olmoe": dict(hidden_size=256, num_experts=8, num_experts_per_tok=2, clip_qkv=0.5),
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2, sliding_window=4),
    # gpt-oss: a sliding layer then a full one, sinks, biased router and clamped experts
    "gpt_oss": dict(num_local_experts=8, num_experts_per_tok=2, sliding_window=4),
    # Qwen3.5: one layer_types period (three gated delta net layers, one gated attention)
    "qwen3_5_text": dict(num_hidden_layers=4, linear_num_key_heads=2, linear_num_value_heads=4),
    # Qwen3-Next: the same period, packed gated delta net projections, MoE with a shared expert
    "qwen3_next": dict(
        num_hidden_layers=4,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        num_experts=8,
        num_experts_per_tok=2,
    ),
    # DeepSeek-V2: latent attention and shared experts, a dense first layer
    "deepseek_v2": dict(
        n_routed_experts=8,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        moe_intermediate_size=48,
        num_key_value_heads=4,
        q_lora_rank=None,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=32,
        v_head_dim=32,
    ),
    # DeepSeek-V3: the same, with its biased sigmoid router over groups
    "deepseek_v3": dict(
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=1,
        moe_intermediate_size=48,
        num_key_value_heads=4,
        q_lora_rank=None,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=32,
        v_head_dim=32,
    ),
}


def _apply(description):
    return lambda model: mp.apply_family(model, description)


@pytest.mark.parametrize("key", sorted(mp.FAMILIES))
def test_registered_families_are_described_as_registered_and_verify(key):
    model_type = mp.FAMILIES[key].model_type  # gemma3's folder patches gemma3_text
    model = _tiny(model_type, **FEATURES.get(model_type, {}))
    if mp.FAMILIES[key].description().forwards:  # written by hand (its own part forwards):
        with pytest.raises(FamilyRefused):  # the probe names what the shared glue lacks
            describe_structure(model)
        return
    probe = describe_structure(model)
    assert probe.family == mp.FAMILIES[key].description()
    assert verify(model, probe.family, _apply(probe.family)) <= 1e-4


def test_a_wrong_description_is_caught_by_the_numbers():
    model = _tiny("qwen3")
    wrong = mp.FAMILIES["llama"].description()  # no q/k norms: upstream modules not patched
    wrong = type(wrong)(
        "transformers.models.qwen3.modeling_qwen3", "Qwen3", qk_norm=False
    )  # the glue then skips Qwen3's q/k norms
    with pytest.raises(FamilyRefused, match="does not reproduce Qwen3"):
        verify(model, wrong, _apply(wrong))


def test_a_wrong_norm_form_is_caught_by_the_numbers():
    """Gemma 3 described with Llama's norms (weight * x, its weights start at zero) is refused."""
    model = _tiny("gemma3_text", **FEATURES["gemma3_text"])
    wrong = dataclasses.replace(mp.FAMILIES["gemma3"].description(), norm_unit_offset=False)
    with pytest.raises(FamilyRefused, match="does not reproduce Gemma3"):
        verify(model, wrong, _apply(wrong))


def test_the_norm_form_is_read_off_the_module():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    class HalfOffset(LlamaRMSNorm):
        """(0.5 + weight) * x / rms(x): neither form."""

        def forward(self, x):
            rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return super().forward(x) + 0.5 * x * rms

    assert norm_form(LlamaRMSNorm(8)) is False
    assert norm_form(Gemma3RMSNorm(8)) is True
    assert norm_form(HalfOffset(8)) is None
    assert norm_form(torch.nn.Identity()) is None


@pytest.mark.parametrize(
    "model_type,extra,match",
    [
        ("gemma3_text", {"attn_logit_softcapping": 50.0}, r"attention logit soft-capping"),
        ("gemma2", {}, r"soft-capping \(Gemma 2\): config.attn_logit_softcapping = 50.0"),
        (
            "llama",
            {"hidden_act": "relu"},
            "activation config.hidden_act = 'relu': no kernel computes it",
        ),
    ],
)
def test_uncovered_features_are_refused_by_name(model_type, extra, match):
    """Gemma 3 is covered, but not with soft-capping (Gemma 2 has it by default)."""
    with pytest.raises(FamilyRefused, match=match):
        describe_structure(_tiny(model_type, **extra))


def test_config_problems_reads_plain_values():
    cfg = copy.deepcopy(AutoConfig.for_model("llama"))
    assert config_problems(cfg) == []
    cfg.attn_logit_softcapping = 50.0
    cfg.hidden_act = "gelu"
    assert [p.split(":")[0] for p in config_problems(cfg)] == [
        "attention logit soft-capping (Gemma 2)",
        "activation config.hidden_act = 'gelu'",
    ]


def test_the_probe_reads_the_residual_multiplier_and_the_nope_switch():
    granite = describe_structure(_tiny("granite", **FEATURES["granite"]))
    assert granite.family.residual_multiplier and granite.family.rope_switch is None
    assert any("residual_multiplier" in note for note in granite.notes)
    smollm3 = describe_structure(_tiny("smollm3", **FEATURES["smollm3"]))
    assert smollm3.family.rope_switch == "use_rope"
    assert not smollm3.family.residual_multiplier
    assert not describe_structure(_tiny("llama")).family.residual_multiplier


@pytest.mark.parametrize("scale", ["residual_multiplier", "attention_multiplier"])
def test_each_granite_scale_is_needed_by_the_numbers(scale):
    """With one scale at a non-default value and the rest at theirs, the registered Granite
    reproduces upstream; a description without the residual field, or an attention that
    ignored the module's scaling, would not (the first is checked here)."""
    defaults = dict(
        embedding_multiplier=1.0, residual_multiplier=1.0, logits_scaling=1.0,
        attention_multiplier=SMALL["head_dim"] ** -0.5,
    )  # fmt: skip
    model = _tiny("granite", **{**defaults, scale: FEATURES["granite"][scale]})
    family = mp.FAMILIES["granite"].description()
    assert verify(model, family, _apply(family)) <= 1e-4
    if scale == "residual_multiplier":
        wrong = dataclasses.replace(family, residual_multiplier=False)
        with pytest.raises(FamilyRefused, match=r"model.layers.0 \(GraniteDecoderLayer"):
            verify(model, wrong, _apply(wrong))


def test_smollm3_without_its_nope_switch_is_refused_at_the_nope_layer():
    """SmolLM3 leaves RoPE out of every 4th layer (``no_rope_layers``): described without the
    switch, the first layer that differs is the 4th, named with its config entry and the one
    patch flag that alone makes it differ."""
    from tilegym.transformers.family_probe import check_family

    model = _tiny("smollm3", num_hidden_layers=4)
    wrong = dataclasses.replace(mp.FAMILIES["smollm3"].description(), rope_switch=None)
    with pytest.raises(FamilyRefused) as refused:
        check_family(model, wrong, lambda m, **f: mp.apply_family(m, wrong, **f))
    message = str(refused.value)
    assert "the first module whose output differs is model.layers.3 (SmolLM3DecoderLayer" in message
    assert "no_rope_layers[3] = 0" in message and "these differ: rope (RoPE)" in message


def test_features_outside_the_patched_modules_are_reproduced():
    """Granite's embedding multiplier, logits scaling and attention multiplier live in the model
    and head forwards or in ``self.scaling``: the numbers agree, so the family is accepted."""
    model = _tiny(
        "granite", embedding_multiplier=12.0, logits_scaling=8.0, attention_multiplier=0.1
    )
    probe = describe_structure(model)
    assert verify(model, probe.family, _apply(probe.family)) <= 1e-4


@pytest.mark.parametrize(
    ("module", "cls", "once"),
    [
        ("olmo2", "Olmo2RMSNorm", True),
        ("olmo3", "Olmo3RMSNorm", True),
        ("olmoe", "OlmoeRMSNorm", False),
        ("llama", "LlamaRMSNorm", False),
    ],
)
def test_the_probe_reads_where_a_norm_rounds(module, cls, once):
    """Olmo2RMSNorm rounds once, after the weight; Llama's form (OLMoE's too) rounds the
    normalized row first: the fused whole-projection q/k kernel follows the one it is told."""
    upstream = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    assert norm_rounds_once(getattr(upstream, cls)(256)) is once


def test_the_probe_reads_the_clip_and_the_router_renormalization():
    """OLMoE has clip_qkv (a config field) and a norm_topk_prob switch on its router (read at
    run time: None); Mixtral's router has no switch and always renormalizes (read off a run:
    True); Qwen3-MoE has the switch and no clip."""
    olmoe = describe_structure(_tiny("olmoe", **FEATURES["olmoe"])).family
    assert olmoe.clip_qkv and olmoe.moe_renormalize is None and olmoe.qk_norm_whole
    mixtral = describe_structure(_tiny("mixtral", **FEATURES["mixtral"]))
    assert mixtral.family.moe_renormalize is True and not mixtral.family.clip_qkv
    assert mixtral.family.config_window and "always renormalized" in " ".join(mixtral.notes)
    qwen3_moe = describe_structure(_tiny("qwen3_moe")).family
    assert qwen3_moe.moe_renormalize is None and not qwen3_moe.clip_qkv


@pytest.mark.parametrize(
    ("key", "field", "wrong"),
    [("olmoe", "clip_qkv", False), ("mixtral", "moe_renormalize", False)],
)
def test_a_description_without_the_clip_or_the_renormalization_is_refused(key, field, wrong):
    """OLMoE with clip_qkv 0.5 described without the clamp, Mixtral described with top-k
    weights left unnormalized: the first decoder layer differs."""
    model = _tiny(key, **FEATURES[key])
    family = mp.FAMILIES[key].description()
    assert verify(model, family, _apply(family)) <= 1e-4
    bad = dataclasses.replace(family, **{field: wrong})
    with pytest.raises(FamilyRefused, match=r"model\.layers\.0 \("):
        verify(model, bad, _apply(bad))


def test_a_sigmoid_gated_shared_expert_is_described_and_reproduced():
    """Qwen2-MoE adds the sigmoid-gated shared expert Qwen3-Next has to its sparse block: the
    probe reads it (``moe_shared_expert``) and the patched tiny model reproduces upstream
    (attention left to PyTorch: Qwen2-MoE's mask function is outside the attention kernels'
    envelope); described without it, the numbers refuse it."""
    model = _tiny("qwen2_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
    family = describe_structure(model).family
    assert family.moe_shared_expert and family.moe_block == "SparseMoeBlock"

    def apply(description):
        return lambda m: mp.apply_family(m, description, attn=False)

    assert verify(model, family, apply(family)) <= 1e-4
    bad = dataclasses.replace(family, moe_shared_expert=False)
    with pytest.raises(FamilyRefused, match=r"model\.layers\.0 \("):
        verify(model, bad, apply(bad))


def test_a_shared_expert_of_another_class_is_refused_by_name():
    """The shared expert runs as the family's dense MLP; another class is named."""
    model = _tiny("qwen2_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
    for layer in model.model.layers:
        layer.mlp.shared_expert = torch.nn.Sequential(layer.mlp.shared_expert)
    with pytest.raises(FamilyRefused, match="a shared expert of class Sequential, not Qwen2MoeMLP"):
        describe_structure(model)


def test_gpt_oss_is_read_off_its_modules_and_a_missing_sink_is_caught():
    """gpt-oss: the router attribute, the clamped experts' layout, the sinks and the half-width
    rotary tables come from the modules; a description without the sinks is refused."""
    model = _tiny("gpt_oss", **FEATURES["gpt_oss"])
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)
    probe = describe_structure(model)
    family = probe.family
    assert (family.moe_block, family.moe_router, family.moe_experts) == ("MLP", "router", "clamped")
    assert family.sinks and family.rope_half_table and family.moe_renormalize is True
    assert any("attention sinks" in note for note in probe.notes)
    wrong = dataclasses.replace(family, sinks=False)
    with pytest.raises(FamilyRefused, match="does not reproduce GptOss"):
        verify(model, wrong, _apply(wrong))


def test_a_linear_attention_mixer_the_glue_cannot_run_is_refused_by_name():
    """A gated delta net with neither Qwen3.5's four projections nor Qwen3-Next's packed two:
    the probe names the mixer and what it lacks instead of describing a family."""
    pytest.importorskip("transformers.models.qwen3_next")
    model = _tiny("qwen3_next", **FEATURES["qwen3_next"])
    for layer in model.model.layers:
        if hasattr(layer, "linear_attn"):
            del layer.linear_attn.in_proj_ba
    with pytest.raises(FamilyRefused, match="mixer Qwen3NextGatedDeltaNet .lacks in_proj_qkv"):
        describe_structure(model)


def test_qwen3_5_without_its_output_gate_is_caught_by_the_numbers():
    """The gate is read off q_proj's width; described without it the glue cannot run Qwen3.5."""
    model = _tiny("qwen3_5_text", **FEATURES["qwen3_5_text"])
    probe = describe_structure(model)
    assert probe.family.attn_output_gate and probe.family.linear_attention == "GatedDeltaNet"
    wrong = dataclasses.replace(probe.family, attn_output_gate=False)
    with pytest.raises(Exception, match="shape|size|does not reproduce"):
        verify(model, wrong, _apply(wrong))
