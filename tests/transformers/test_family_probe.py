"""The family probe: registered families are described as they are registered, and families
the ops do not cover are refused by name (structure, config or numbers)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tilegym.transformers import monkey_patch as mp
from tilegym.transformers.family_probe import (
    FamilyRefused,
    config_problems,
    describe_structure,
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


def _apply(description):
    return lambda model: mp.apply_family(model, description)


@pytest.mark.parametrize("model_type", sorted(mp.FAMILIES))
def test_registered_families_are_described_as_registered_and_verify(model_type):
    model = _tiny(model_type)
    probe = describe_structure(model)
    assert probe.family == mp.FAMILIES[model_type].description()
    assert verify(model, probe.family, _apply(probe.family)) <= 1e-4


def test_a_wrong_description_is_caught_by_the_numbers():
    model = _tiny("qwen3")
    wrong = mp.FAMILIES["llama"].description()  # no q/k norms: upstream modules not patched
    wrong = type(wrong)(
        "transformers.models.qwen3.modeling_qwen3", "Qwen3", qk_norm=False
    )  # the glue then skips Qwen3's q/k norms
    with pytest.raises(FamilyRefused, match="does not reproduce Qwen3"):
        verify(model, wrong, _apply(wrong))


@pytest.mark.parametrize(
    "model_type,extra,match",
    [
        ("gemma3_text", {}, "activation 'gelu_pytorch_tanh'.*pre_feedforward_layernorm"),
        ("granite", {"residual_multiplier": 0.22}, "scaled residual adds"),
    ],
)
def test_uncovered_features_are_refused_by_name(model_type, extra, match):
    """Gemma 3 also has norms on both sides of each sub-block (named in the same line)."""
    with pytest.raises(FamilyRefused, match=match):
        describe_structure(_tiny(model_type, **extra))


def test_config_problems_reads_plain_values():
    cfg = copy.deepcopy(AutoConfig.for_model("llama"))
    assert config_problems(cfg) == []
    cfg.attn_logit_softcapping = 50.0
    cfg.hidden_act = "gelu"
    assert [p.split(":")[0] for p in config_problems(cfg)] == [
        "attention logit soft-capping (Gemma 2)",
        "activation 'gelu'",
    ]


def test_features_outside_the_patched_modules_are_reproduced():
    """Granite's embedding multiplier, logits scaling and attention multiplier live in the model
    and head forwards or in ``self.scaling``: the numbers agree, so the family is accepted."""
    model = _tiny(
        "granite", embedding_multiplier=12.0, logits_scaling=8.0, attention_multiplier=0.1
    )
    probe = describe_structure(model)
    assert verify(model, probe.family, _apply(probe.family)) <= 1e-4
