"""Granite's muP scales and SmolLM3's NoPE layers and sliding window, patched against upstream on
the CPU (fp32): every Granite multiplier off its default (a missing fold or scale fails), the
residual multiplier folded into scaled o_proj/down_proj weights built at patch time and freed by
``undo()``, and SmolLM3 on 4 layers (the 4th without RoPE) with its window on and off."""

from __future__ import annotations

import pytest
import torch
from cpu_generate import (
    assert_compiles_like_upstream,
    assert_same_as_upstream,
    left_padded_batch,
    patched_pair,
)

from tilegym.transformers import monkey_patch as mp

GRANITE = dict(
    num_hidden_layers=2,
    embedding_multiplier=12.0,
    residual_multiplier=0.22,
    attention_multiplier=0.03,  # not 1/sqrt(64)
    logits_scaling=8.0,
)
SMOLLM3 = dict(num_hidden_layers=4)  # no_rope_layers [1, 1, 1, 0] from the interval 4
WINDOWED = dict(SMOLLM3, use_sliding_window=True, sliding_window=4)  # the NoPE layer slides


def _same(base, patched):
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    assert_same_as_upstream(base, patched, ids, mask)


CASES = [("granite", GRANITE), ("smollm3", SMOLLM3), ("smollm3", WINDOWED)]


@pytest.mark.parametrize(("model_type", "extra"), CASES)
def test_the_patched_model_computes_the_upstream_one(model_type, extra):
    base, patched, handle = patched_pair(model_type, **extra)
    assert handle.applied == list(mp.FLAGS), handle.not_applied
    _same(base, patched)


@pytest.mark.parametrize("scale", sorted(set(GRANITE) - {"num_hidden_layers"}))
def test_each_granite_multiplier_alone_is_reproduced(scale):
    """One multiplier off its default at a time (the others at their class defaults)."""
    base, patched, _ = patched_pair("granite", num_hidden_layers=2, **{scale: GRANITE[scale]})
    _same(base, patched)


def test_the_residual_multiplier_rides_in_scaled_weights_freed_by_undo():
    base, patched, handle = patched_pair("granite", **GRANITE)
    for layer in patched.model.layers:
        for module, name in ((layer.self_attn, "o_proj"), (layer.mlp, "down_proj")):
            weight = getattr(module, name).weight
            scaled = module.__dict__[f"_tilegym_scaled_{name}"]
            assert torch.equal(scaled, weight.detach() * 0.22)
    handle.undo()
    assert not any("_tilegym_scaled_" in k for m in patched.modules() for k in vars(m))


def test_the_nope_layer_skips_rope_and_the_others_rotate():
    """Layer 3's attention has ``use_rope`` 0: the patched model reproduces upstream, and a
    description that rotated it too would not (its layer 3 output differs)."""
    import dataclasses

    from tilegym.transformers.family_probe import FamilyRefused, verify

    base, _, _ = patched_pair("smollm3", **SMOLLM3)
    assert [layer.self_attn.use_rope for layer in base.model.layers] == [1, 1, 1, 0]
    family = mp.FAMILIES["smollm3"].description()
    wrong = dataclasses.replace(family, rope_switch=None)
    with pytest.raises(FamilyRefused, match=r"model\.layers\.3 \(SmolLM3DecoderLayer"):
        verify(base, wrong, lambda m: mp.apply_family(m, wrong))


@pytest.mark.slow
@pytest.mark.parametrize(("model_type", "extra"), CASES)
def test_the_patched_model_compiles_with_a_static_cache(model_type, extra):
    base, patched, _ = patched_pair(model_type, **extra)
    assert_compiles_like_upstream(base, patched)
