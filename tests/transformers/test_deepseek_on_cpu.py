"""DeepSeek-V2 and V3 (multi-head latent attention, shared-expert MoE) patched against upstream
on the CPU (fp32): logits at every unpadded position, every decode step's logits and greedy
tokens of a left-padded batch, with a dynamic cache (the latent decode in the absorbed form), a
static cache (its device position) and the static decode step compiled; q low-rank or plain,
V2's greedy and group-limited routing, V3's biased sigmoid router with group limits, with and
without renormalization, a routed scaling factor, YaRN's softmax-scale mscale, V3's RoPE
interleaved or by halves, and each flag off in turn. The run is checked to go through the ops
(prefill once per layer, then the latent decode with its per-head products; the static cache's
decode-step writes; the router's fp32 linear, fused with V2's greedy routing; V2's RoPE tables
once per forward)."""

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
# V3: the biased sigmoid router over 4 groups keeping 2, renormalized, scaled; interleaved RoPE
V3 = dict(TINY, q_lora_rank=48)
V3_PLAIN = dict(TINY, q_lora_rank=None, rope_interleave=False, norm_topk_prob=False)
CASES = [
    ("deepseek_v2", TINY),
    ("deepseek_v2", LORA_GROUPED),
    ("deepseek_v2", SCALED),
    ("deepseek_v3", V3),
    ("deepseek_v3", V3_PLAIN),
]
IDS = ["v2-lite", "v2-lora-grouped", "v2-scaled", "v3", "v3-plain"]


def _pair(model, extra, **flags):
    path = Path(tilegym.transformers.__file__).parent / model / "small_config.json"
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
        for name, b in base.named_buffers():  # V3's choice bias: make it count
            if name.endswith("e_score_correction_bias"):
                b.normal_(0, 0.3)
    patched = copy.deepcopy(base)
    return base, patched, mp.apply_tilegym_kernel(patched, **flags)


class _Count:
    """Counts the calls of the library's MLA custom ops (what the CPU run executes)."""

    def __init__(self, monkeypatch):
        from tilegym.ops import library

        self.calls = {
            name: 0
            for name in (
                "mla_prefill_op",
                "mla_decode_op",
                "apply_rope_op",
                "mla_absorb_query_op",
                "mla_latent_to_heads_op",
                "latent_cache_write_at_op",
                "router_greedy_op",
                "router_logits_op",
                "rotary_tables_op",
            )
        }
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


@pytest.mark.parametrize(("model", "extra"), CASES, ids=IDS)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_the_patched_model_computes_the_upstream_one(model, extra, cache, monkeypatch):
    base, patched, handle = _pair(model, extra)
    assert handle.applied == list(mp.FLAGS), handle.not_applied
    count = _Count(monkeypatch)
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    kw = {"cache_implementation": "static"} if cache == "static" else {}
    _same(base, patched, ids, mask, **kw)
    layers = base.config.num_hidden_layers
    assert count.calls["mla_prefill_op"] == 2 * layers  # the logits' forward and the prompt
    assert count.calls["mla_decode_op"] == 7 * layers  # the 7 decode steps of 8 new tokens
    assert count.calls["mla_absorb_query_op"] == count.calls["mla_latent_to_heads_op"] == 7 * layers
    # a static cache: each decode step writes at the mask's device position (the prompt, whose
    # mask holds a host offset, through the layer's own update)
    writes = 7 * layers if cache == "static" else 0
    assert count.calls["latent_cache_write_at_op"] == writes
    # the routers of the sparse layers in the logits' forward, the prompt and 7 decode steps;
    # V2's greedy one fused after the linear, the others after the logits op
    sparse = 9 * (layers - base.config.first_k_dense_replace)
    greedy = model == "deepseek_v2" and extra.get("topk_method", "greedy") == "greedy"
    assert count.calls["router_greedy_op"] == (sparse if greedy else 0)
    assert count.calls["router_logits_op"] == (0 if greedy else sparse)
    # the rotary module gives the half-split tables once per forward (V2: from its complex
    # table, tilegym.transformers.mla; V3: Llama's form, tilegym.transformers.rope_tables)
    assert count.calls["rotary_tables_op"] == 9


@pytest.mark.parametrize("model", ["deepseek_v2", "deepseek_v3"])
@pytest.mark.parametrize("flag", ["attn", "linear", "rope", "rms_norm", "swiglu"])
def test_each_flag_off_still_computes_the_upstream_model(model, flag, monkeypatch):
    """attn off: the model's own attention over expanded keys; linear off: upstream
    projections and upstream's complex rotation (the permuted rows ride in the fused GEMM);
    rope off: upstream's rotation; the rest as in every family."""
    base, patched, handle = _pair(
        model, LORA_GROUPED if model == "deepseek_v2" else V3, **{flag: False}
    )
    assert flag in handle.not_applied
    ids, mask = left_padded_batch((0, 4, 9), seed=2)
    count = _Count(monkeypatch)
    _same(base, patched, ids, mask)
    # the rope flag alone decides the RoPE kernel (with linear off: on gathered columns)
    assert (count.calls["apply_rope_op"] > 0) == (flag != "rope")
    assert (count.calls["mla_decode_op"] > 0) == (flag != "attn")
    assert (count.calls["rotary_tables_op"] > 0) == (flag != "rope")


@pytest.mark.parametrize("model", ["deepseek_v2", "deepseek_v3"])
def test_the_cache_keeps_upstreams_latent_layout(model):
    """Per layer the normed latent [B, 1, T, L] and the rope key [B, 1, T, R]: the latent
    equals upstream's; V2's rope key is upstream's with each head's pairs split into evens then
    odds (the RoPE kernel's layout), V3's is upstream's (its rotation writes that layout)."""
    from transformers import DynamicCache

    from tilegym.transformers.mla import rope_permutation

    base, patched, _ = _pair(model, TINY)
    ids, mask = left_padded_batch((0, 4, 9), seed=3)
    caches = [DynamicCache(config=base.config), DynamicCache(config=base.config)]
    with torch.no_grad():
        for net, cache in zip((base, patched), caches, strict=True):
            net(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    perm = rope_permutation(TINY["qk_rope_head_dim"])
    if model == "deepseek_v3":
        perm = torch.arange(TINY["qk_rope_head_dim"])
    for want, got in zip(caches[0].layers, caches[1].layers, strict=True):
        assert got.keys.shape == (3, 1, 11, TINY["kv_lora_rank"])
        assert got.values.shape == (3, 1, 11, TINY["qk_rope_head_dim"])
        # padding positions hold whatever a row without keys gives (never attended)
        valid = mask.bool()
        got_k, want_k = got.keys[:, 0][valid], want.keys[:, 0][valid]
        torch.testing.assert_close(got_k, want_k, rtol=1e-5, atol=1e-5)
        got_r, want_r = got.values[:, 0][valid], want.values[:, 0][valid][..., perm]
        torch.testing.assert_close(got_r, want_r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("model", "kinds"),
    [
        ("deepseek_v2", ("DeepseekV2MLP", "DeepseekV2Moe")),
        ("deepseek_v3", ("DeepseekV3MLP", "DeepseekV3MoE")),
    ],
)
def test_first_layers_are_dense_and_the_rest_sparse_with_shared_experts(model, kinds):
    _, patched, _ = _pair(model, TINY)
    got = [type(layer.mlp).__name__ for layer in patched.model.layers]
    assert got == [kinds[0], kinds[1], kinds[1]]
    for layer in patched.model.layers[1:]:
        assert "forward" in vars(layer.mlp) and "forward" in vars(layer.mlp.shared_experts)


def test_the_shared_experts_matter():
    """Zeroing the shared experts' down projection changes the output (a forward that dropped
    them would fail the equality tests)."""
    _, patched, _ = _pair("deepseek_v2", TINY)
    ids, mask = left_padded_batch((0,), seed=4)
    with torch.no_grad():
        a = patched(input_ids=ids, attention_mask=mask).logits
        for layer in patched.model.layers[1:]:
            layer.mlp.shared_experts.down_proj.weight.zero_()
        b = patched(input_ids=ids, attention_mask=mask).logits
    assert (a - b).abs().max() > 1e-3


@pytest.mark.parametrize("model", ["deepseek_v2", "deepseek_v3"])
def test_undo_restores_the_upstream_forwards(model):
    base, patched, handle = _pair(model, TINY)
    handle.undo()
    assert not any("forward" in vars(m) for m in patched.modules())
    ids, mask = left_padded_batch((0, 4, 9), seed=5)
    with torch.no_grad():
        torch.testing.assert_close(
            patched(input_ids=ids, attention_mask=mask).logits,
            base(input_ids=ids, attention_mask=mask).logits,
        )


@pytest.mark.slow
@pytest.mark.parametrize(("model", "extra"), CASES, ids=IDS)
def test_the_patched_model_compiles_with_a_static_cache(model, extra):
    base, patched, _ = _pair(model, extra)
    assert_compiles_like_upstream(base, patched)
