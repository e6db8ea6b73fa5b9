"""The branch-free longrope update (Phi-3.5's RoPE) against transformers' own, on the CPU."""

from __future__ import annotations

import copy
import types

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tilegym.transformers import monkey_patch as mp
from tilegym.transformers.longrope import branch_free_forward

ORIGINAL_MAX = 32


def _phi3(**extra):
    rope = {
        "type": "longrope",
        "short_factor": [1.0 + 0.1 * i for i in range(8)],
        "long_factor": [2.0 + 0.5 * i for i in range(8)],
    }
    config = AutoConfig.for_model(
        "phi3",
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_hidden_layers=1,
        vocab_size=128,
        pad_token_id=0,
        max_position_embeddings=4 * ORIGINAL_MAX,
        original_max_position_embeddings=ORIGINAL_MAX,
        **{"rope_scaling": rope, **extra},
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("last", [5, ORIGINAL_MAX - 1, ORIGINAL_MAX, 3 * ORIGINAL_MAX])
def test_the_same_tables_as_upstream_below_at_and_beyond_the_original_length(last):
    """Short factors while every position is below the original length, long ones beyond, in
    both orders (a long prompt, then a short one: the buffer is rewritten each call)."""
    upstream = _phi3().model.rotary_emb
    ours = copy.deepcopy(upstream)
    ours.forward = types.MethodType(branch_free_forward(ours), ours)
    x = torch.randn(2, 3, 64)
    for end in (last, 3 * ORIGINAL_MAX, 2):
        positions = torch.arange(end - 2, end + 1).expand(2, -1)
        for want, got in zip(upstream(x, positions), ours(x, positions), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_it_compiles_without_a_graph_break():
    """transformers 5.17's own update reads ``max(position_ids)`` on the host: a graph break."""
    rotary = _phi3().model.rotary_emb
    rotary.forward = types.MethodType(branch_free_forward(rotary), rotary)
    compiled = torch.compile(rotary, backend="eager", fullgraph=True)
    x = torch.randn(1, 1, 64)
    for position in (3, 2 * ORIGINAL_MAX):
        want = rotary(x, torch.tensor([[position]]))
        for w, g in zip(want, compiled(x, torch.tensor([[position]])), strict=True):
            torch.testing.assert_close(g, w)


def test_the_patch_replaces_it_with_rope_and_undo_restores_it():
    model = _phi3()
    rotary = model.model.rotary_emb
    handle = mp.apply_tilegym_kernel(model, rms_norm=False, swiglu=False, linear=False, attn=False)
    assert "forward" in rotary.__dict__
    handle.undo()
    assert "forward" not in rotary.__dict__
    mp.apply_tilegym_kernel(model, rope=False, attn=False).undo()
    assert "forward" not in rotary.__dict__


def test_other_rope_types_are_left_alone():
    model = _phi3(rope_scaling=None)
    assert branch_free_forward(model.model.rotary_emb) is None
