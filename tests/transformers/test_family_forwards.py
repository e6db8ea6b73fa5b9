"""A family module wires its own forward builders through ``Family.forwards``: how an
experiment for one model routes a new kernel without touching the shared glue (which its scope
forbids). On the CPU with a tiny Qwen3: the family's builder is the one the patch uses, the
others stay shared, and a misspelled part is refused by name."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import tilegym.transformers
from tilegym.transformers import decoder as glue
from tilegym.transformers import monkey_patch as mp
from tilegym.transformers.qwen3.modeling_qwen3 import FAMILY


def _tiny_qwen3():
    path = Path(tilegym.transformers.__file__).parent / "qwen3" / "small_config.json"
    config = AutoConfig.for_model(**json.loads(path.read_text()))
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def test_a_family_builder_replaces_only_its_part():
    calls = []

    def make_attention_forward(routes, fused, gemm, *rest):
        calls.append(routes)
        shared = glue.make_attention_forward(routes, fused, gemm, *rest)

        def forward(self, *args, **kwargs):
            calls.append("forward")
            return shared(self, *args, **kwargs)

        return forward

    model = _tiny_qwen3()
    ids = torch.randint(0, model.config.vocab_size, (1, 9))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    desc = dataclasses.replace(FAMILY, forwards={"Attention": make_attention_forward})
    handle = mp.apply_family(model, desc, attn=False)
    try:
        with torch.no_grad():
            got = model(input_ids=ids).logits
    finally:
        handle.undo()
    assert len(calls) == 1 + model.config.num_hidden_layers  # built once, called per layer
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
    mlp = model.model.layers[0].mlp
    assert "forward" not in mlp.__dict__  # undone


def test_an_unknown_part_is_refused_by_name():
    desc = dataclasses.replace(FAMILY, forwards={"Attn": glue.make_attention_forward})
    with pytest.raises(ValueError, match=r"names \['Attn'\]; known parts: RMSNorm, MLP"):
        mp.apply_family(_tiny_qwen3(), desc)
