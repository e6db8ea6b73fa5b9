"""OLMo 3's sliding-window layers, OLMoE's clipped q/k/v and its router without renormalization,
and Mixtral's always-renormalized top-2 router with Mistral's window, patched against upstream on
the CPU (fp32): logits, greedy tokens of a left-padded batch, and a static cache (OLMo 3's
sliding layers as ring buffers, prompts longer than the window) eager and compiled."""

from __future__ import annotations

import pytest
import torch
from cpu_generate import (
    assert_compiles_like_upstream,
    assert_same_as_upstream,
    greedy,
    left_padded_batch,
    patched_pair,
)

from tilegym.transformers import monkey_patch as mp

# one layer_types period: layers 0-2 slide over 4 tokens (the prompts hold 11), layer 3 is full
OLMO3 = dict(num_hidden_layers=4, sliding_window=4)
# OLMoE's q norm spans hidden_size: the 4 heads of 64 fill it
OLMOE = dict(hidden_size=256, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2)
OLMOE_CLIPPED = dict(OLMOE, clip_qkv=0.5, norm_topk_prob=True)
MIXTRAL = dict(num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2, sliding_window=4)
MIXTRAL_FULL = dict(MIXTRAL, sliding_window=None)


CASES = [
    ("olmo3", OLMO3),
    ("olmoe", OLMOE),
    ("olmoe", OLMOE_CLIPPED),
    ("mixtral", MIXTRAL),
    ("mixtral", MIXTRAL_FULL),
]


@pytest.mark.parametrize(("model_type", "extra"), CASES)
def test_the_patched_model_computes_the_upstream_one(model_type, extra):
    base, patched, handle = patched_pair(model_type, **extra)
    assert handle.applied == list(mp.FLAGS), handle.not_applied
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    assert_same_as_upstream(base, patched, ids, mask)


def test_olmo3_slides_on_three_of_four_layers():
    base, _, _ = patched_pair("olmo3", **OLMO3)
    windows = [layer.self_attn.sliding_window for layer in base.model.layers]
    assert windows == [4, 4, 4, None]


def test_the_clip_binds_and_is_reproduced():
    """clip_qkv 0.5 changes OLMoE's output (the clamp binds), and the patch reproduces it."""
    clipped, _, _ = patched_pair("olmoe", **OLMOE_CLIPPED)
    free, _, _ = patched_pair("olmoe", **dict(OLMOE_CLIPPED, clip_qkv=None))
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    with torch.no_grad():
        a = clipped(input_ids=ids, attention_mask=mask).logits
        b = free(input_ids=ids, attention_mask=mask).logits
    assert (a - b).abs().max() > 1e-3


@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_olmoe_routes_with_and_without_renormalization(norm_topk_prob):
    """The published OLMoE leaves the top-k weights as they are; the switch is read per
    router at run time."""
    base, patched, _ = patched_pair("olmoe", **dict(OLMOE, norm_topk_prob=norm_topk_prob))
    assert all(layer.mlp.gate.norm_topk_prob is norm_topk_prob for layer in base.model.layers)
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    assert_same_as_upstream(base, patched, ids, mask)


def test_mixtral_has_no_dense_mlp_and_its_sparse_blocks_are_patched():
    _, patched, _ = patched_pair("mixtral", **MIXTRAL)
    blocks = [layer.mlp for layer in patched.model.layers]
    assert all(type(b).__name__ == "MixtralSparseMoeBlock" for b in blocks)
    assert all("forward" in vars(b) for b in blocks)


@pytest.mark.parametrize(("model_type", "extra"), [("olmo3", OLMO3), ("mixtral", MIXTRAL)])
def test_a_static_cache_past_the_window_generates_the_upstream_tokens(model_type, extra):
    """Prompts of 11 tokens and 5 new ones over a window of 4: OLMo 3's sliding layers (static
    sliding-window layers kept as ring buffers) and Mixtral's windowed full-length layers."""
    base, patched, _ = patched_pair(model_type, **extra)
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    got = greedy(patched, ids, mask, new_tokens=8, cache_implementation="static")
    assert torch.equal(got, greedy(base, ids, mask, new_tokens=8))


@pytest.mark.slow
@pytest.mark.parametrize(("model_type", "extra"), CASES)
def test_the_patched_model_compiles_with_a_static_cache(model_type, extra):
    base, patched, _ = patched_pair(model_type, **extra)
    assert_compiles_like_upstream(base, patched)
