"""DeepSeek-V2 (multi-head latent attention, shared-expert MoE) patched against upstream on the
CPU (fp32): logits at every unpadded position and greedy tokens of a left-padded batch, with a
dynamic cache (the latent decode in the absorbed form), a static cache (its device position)
and the static decode step compiled; q low-rank or plain, greedy and group-limited routing, a
routed scaling factor, YaRN's softmax-scale mscale, and each flag off in turn. The run is
checked to go through the MLA kernels' ops (prefill once per layer, then the latent decode)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from cpu_generate import assert_compiles_like_upstream, left_padded_batch
from transformers import AutoConfig, AutoModelForCausalLM

import tilegym.transformers
from tilegym.transformers import monkey_patch as mp

# the MLA kernels' widths are powers of two >= 16; 3 layers: the first dense, two sparse
TINY = dict(
    hidden_size=128,
    intermediate_size=192,
    moe_intermediate_size=48,
    vocab_size=256,
    kv_lora_rank=32,
    qk_rope_head_dim=16,
    qk_nope_head_dim=32,
    v_head_dim=32,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_routed_experts=8,
    num_experts_per_tok=3,
)
LORA_GROUPED = dict(
    TINY, q_lora_rank=48, topk_method="group_limited_greedy", n_group=4, topk_group=2
)
SCALED = dict(TINY, routed_scaling_factor=2.5, rope_parameters={"rope_type": "default"})


def _pair(extra, **flags):
    path = Path(tilegym.transformers.__file__).parent / "deepseek_v2" / "small_config.json"
    d = {**json.loads(path.read_text()), **extra}
    if d["rope_parameters"].get("rope_type") == "default":
        d["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(AutoConfig.for_model(**d)).eval().float()
    with torch.no_grad():  # routers start at zero: make routing depend on the tokens; scores
        # of O(1) (not the init's near-uniform softmax) make a wrong score show in the logits
        for name, p in base.named_parameters():
            if name.endswith("gate.weight"):
                p.normal_(0, 0.5)
            elif ".self_attn." in name and p.ndim == 2 and "o_proj" not in name:
                p.normal_(0, 0.2)
    patched = copy.deepcopy(base)
    return base, patched, mp.apply_tilegym_kernel(patched, **flags)


class _Count:
    """Counts the calls of the library's MLA custom ops (what the CPU run executes)."""

    def __init__(self, monkeypatch):
        from tilegym.ops import library

        self.calls = {"mla_prefill_op": 0, "mla_decode_op": 0}
        for name in self.calls:
            op = getattr(library, name)

            def wrap(*args, _op=op, _name=name, **kw):
                self.calls[_name] += 1
                return _op(*args, **kw)

            monkeypatch.setattr(library, name, wrap)


def _steps(model, ids, mask, **kw):
    """(greedy new tokens, each step's logits) of 8 new tokens."""
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=8,
            min_new_tokens=8,
            do_sample=False,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
            **kw,
        )
    return out.sequences[:, ids.shape[1] :], torch.stack(out.logits)


def _same(base, patched, ids, mask, **kw):
    """Logits of the whole prompt (every unpadded position) and of every decode step within
    1e-4, and the same greedy tokens."""
    with torch.no_grad():
        want = base(input_ids=ids, attention_mask=mask).logits
        got = patched(input_ids=ids, attention_mask=mask).logits
    valid = mask.bool()
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-4)
    tokens, logits = _steps(patched, ids, mask, **kw)
    want_tokens, want_logits = _steps(base, ids, mask)
    torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(tokens, want_tokens)


@pytest.mark.parametrize(
    "extra", [TINY, LORA_GROUPED, SCALED], ids=["lite", "lora-grouped", "scaled"]
)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_the_patched_model_computes_the_upstream_one(extra, cache, monkeypatch):
    base, patched, handle = _pair(extra)
    assert handle.applied == list(mp.FLAGS), handle.not_applied
    count = _Count(monkeypatch)
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    kw = {"cache_implementation": "static"} if cache == "static" else {}
    _same(base, patched, ids, mask, **kw)
    layers = base.config.num_hidden_layers
    assert count.calls["mla_prefill_op"] == 2 * layers  # the logits' forward and the prompt
    assert count.calls["mla_decode_op"] == 7 * layers  # the 7 decode steps of 8 new tokens


@pytest.mark.parametrize("flag", ["attn", "linear", "rope", "rms_norm", "swiglu"])
def test_each_flag_off_still_computes_the_upstream_model(flag):
    """attn off: the model's own attention over expanded keys; linear off: upstream
    projections and upstream's complex rotation (the permuted rows ride in the fused GEMM);
    rope off: upstream's rotation; the rest as in every family."""
    base, patched, handle = _pair(LORA_GROUPED, **{flag: False})
    assert flag in handle.not_applied
    ids, mask = left_padded_batch((0, 4, 9), seed=2)
    _same(base, patched, ids, mask)


def test_the_cache_keeps_upstreams_latent_layout():
    """Per layer the normed latent [B, 1, T, L] and the rope key [B, 1, T, R]: the latent
    equals upstream's, the rope key is upstream's with each head's pairs split into evens then
    odds (the RoPE kernel's layout)."""
    from transformers import DynamicCache

    from tilegym.transformers.deepseek_v2.modeling_deepseek_v2 import rope_permutation

    base, patched, _ = _pair(TINY)
    ids, mask = left_padded_batch((0, 4, 9), seed=3)
    caches = [DynamicCache(config=base.config), DynamicCache(config=base.config)]
    with torch.no_grad():
        for model, cache in zip((base, patched), caches, strict=True):
            model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    perm = rope_permutation(TINY["qk_rope_head_dim"])
    for want, got in zip(caches[0].layers, caches[1].layers, strict=True):
        assert got.keys.shape == (3, 1, 11, TINY["kv_lora_rank"])
        assert got.values.shape == (3, 1, 11, TINY["qk_rope_head_dim"])
        torch.testing.assert_close(got.keys, want.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.values, want.values[..., perm], rtol=1e-5, atol=1e-5)


def test_first_layers_are_dense_and_the_rest_sparse_with_shared_experts():
    _, patched, _ = _pair(TINY)
    kinds = [type(layer.mlp).__name__ for layer in patched.model.layers]
    assert kinds == ["DeepseekV2MLP", "DeepseekV2Moe", "DeepseekV2Moe"]
    for layer in patched.model.layers[1:]:
        assert "forward" in vars(layer.mlp) and "forward" in vars(layer.mlp.shared_experts)


def test_the_shared_experts_matter():
    """Zeroing the shared experts' down projection changes the output (a forward that dropped
    them would fail the equality tests)."""
    _, patched, _ = _pair(TINY)
    ids, mask = left_padded_batch((0,), seed=4)
    with torch.no_grad():
        a = patched(input_ids=ids, attention_mask=mask).logits
        for layer in patched.model.layers[1:]:
            layer.mlp.shared_experts.down_proj.weight.zero_()
        b = patched(input_ids=ids, attention_mask=mask).logits
    assert (a - b).abs().max() > 1e-3


def test_undo_restores_the_upstream_forwards():
    base, patched, handle = _pair(TINY)
    handle.undo()
    assert not any("forward" in vars(m) for m in patched.modules())
    ids, mask = left_padded_batch((0, 4, 9), seed=5)
    with torch.no_grad():
        torch.testing.assert_close(
            patched(input_ids=ids, attention_mask=mask).logits,
            base(input_ids=ids, attention_mask=mask).logits,
        )


@pytest.mark.slow
@pytest.mark.parametrize("extra", [TINY, LORA_GROUPED], ids=["lite", "lora-grouped"])
def test_the_patched_model_compiles_with_a_static_cache(extra):
    base, patched, _ = _pair(extra)
    assert_compiles_like_upstream(base, patched)
