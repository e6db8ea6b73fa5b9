"""The family probe: registered families are described as they are registered, and families
the ops do not cover are refused by name (structure, config or numbers)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tilegym.transformers import monkey_patch as mp
from tilegym.transformers.family_probe import (
    FamilyRefused,
    config_problems,
    describe_structure,
    norm_form,
    verify,
)

SMALL = dict(
    hidden_size=128,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=256,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def _tiny(model_type: str, **extra):
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{**SMALL, **extra})
    return AutoModelForCausalLM.from_config(config).eval()


#: per model type, what makes the tiny model show its features to the numeric check (Gemma 3:
#: a sliding-window layer, its window shorter than the probe's prompts, then a global layer)
FEATURES = {"gemma3_text": dict(sliding_window_pattern=2, sliding_window=4)}


def _apply(description):
    return lambda model: mp.apply_family(model, description)


@pytest.mark.parametrize("key", sorted(mp.FAMILIES))
def test_registered_families_are_described_as_registered_and_verify(key):
    model_type = mp.FAMILIES[key].model_type  # gemma3's folder patches gemma3_text
    model = _tiny(model_type, **FEATURES.get(model_type, {}))
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
        ("granite", {"residual_multiplier": 0.22}, "scaled residual adds"),
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


def test_features_outside_the_patched_modules_are_reproduced():
    """Granite's embedding multiplier, logits scaling and attention multiplier live in the model
    and head forwards or in ``self.scaling``: the numbers agree, so the family is accepted."""
    model = _tiny(
        "granite", embedding_multiplier=12.0, logits_scaling=8.0, attention_multiplier=0.1
    )
    probe = describe_structure(model)
    assert verify(model, probe.family, _apply(probe.family)) <= 1e-4
