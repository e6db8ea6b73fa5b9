"""qwen3_5's Definitions compute what the patched model computes on the CPU: each reference
against the ``tilegym.ops.library`` functions the glue calls (their PyTorch implementations on
the CPU), through the inventory's own parity check (fresh random bf16 inputs at sampled shapes,
the reference in float64, inputs the ops update in place declared ``mutates:``). On a GPU the
same check runs the Solutions' cuTile entry points (``test_kernel_inventory.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.nn.functional as F
from linear_attention_glue import MIXER_GLUE

import tilegym.transformers
from tilegym.kernel_inventory.models import Definition
from tilegym.kernel_inventory.parity import check_parity
from tilegym.ops import library as lib

FOLDER = Path(tilegym.transformers.__file__).parent / "qwen3_5" / "kernel_definitions"


def _attention(causal: bool):
    def run(q, k, v):
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=256**-0.5)
        return out.transpose(1, 2).contiguous()

    return run


def _kv_write(key_new, value_new, key_cache, value_cache):
    key_cache.copy_(key_new)
    value_cache.copy_(value_new)


def _unit_norm(x, w):
    return lib.rms_norm(x, w, 1e-6, True)


def _residual(x, w, r):
    return r + lib.linear(x, w, None)


#: Definition stem -> what the CPU glue runs for it
GLUE = {
    **MIXER_GLUE,
    "rms_norm": _unit_norm,
    "qk_norm": _unit_norm,
    "rope_partial": lib.apply_rope,
    "linear_qkv": lambda x, w: lib.linear(x, w, None),
    "linear_in_proj": lambda x, w: lib.linear(x, w, None),
    "linear_lm_head": lambda x, w: lib.linear(x, w, None),
    "linear_o_proj_residual": _residual,
    "linear_out_proj_residual": _residual,
    "linear_down_proj_residual": _residual,
    "linear_gate_up_silu": lambda x, w: lib.silu_and_mul(*lib.linear(x, w, None).chunk(2, -1)),
    "attention_prefill": _attention(True),
    "attention_decode": _attention(False),
    "kv_cache_update": _kv_write,
}


def _definition(stem: str) -> Definition:
    return Definition.from_dict(json.loads((FOLDER / f"qwen3_5_{stem}.json").read_text()))


def test_every_definition_has_its_glue_here():
    assert sorted(p.stem.removeprefix("qwen3_5_") for p in FOLDER.glob("*.json")) == sorted(GLUE)


@pytest.mark.parametrize("stem", sorted(GLUE))
def test_the_reference_computes_what_the_cpu_glue_computes(stem):
    issues = check_parity(
        _definition(stem),
        GLUE[stem],
        device="cpu",
        destination_passing_style=stem == "kv_cache_update",
        n_shapes=2,
    )
    assert not issues, [i.message for i in issues]


def test_the_check_catches_a_beta_left_unrounded():
    """Upstream's ``b.sigmoid()`` is rounded to bf16 before the delta rule: a reference that
    skipped that rounding is 1e-3 off in the fp32 state, which the check reports."""
    definition = _definition("gated_delta_chunk")
    exact = definition.reference.replace(".to(torch.bfloat16).to(b.dtype)", "")
    assert exact != definition.reference
    wrong = Definition.from_dict(
        {**json.loads((FOLDER / "qwen3_5_gated_delta_chunk.json").read_text()), "reference": exact}
    )
    issues = check_parity(wrong, GLUE["gated_delta_chunk"], device="cpu", n_shapes=1)
    assert any("'state'" in i.message for i in issues)


def test_a_reference_sees_upcast_copies_not_the_state_the_op_updates():
    """The decode Definitions declare the in-place update (``mutates:``) and return the updated
    state as an output, so the parity check compares it too."""
    for stem, name in (("gated_delta_recurrent", "state"), ("causal_conv1d_update", "conv_state")):
        definition = _definition(stem)
        assert (
            f"mutates:{name}" in json.loads((FOLDER / f"qwen3_5_{stem}.json").read_text())["tags"]
        )
        assert "new_state" in definition.outputs
