"""gpt-oss's Definitions compute what the ops' CPU references (and so the patched model) compute:
each gpt-oss-specific reference on small random inputs against ``tilegym.ops`` references
(attention with sinks, full and sliding; the top-4 route; the clamped experts' two halves on
the relaid weights; the half-split YaRN rotation). And the inventory is complete: every cuTile
op the patched model calls, prefill and decode, default and static cache, has its Definition,
and every Definition is called."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from cpu_generate import greedy, left_padded_batch, patched_pair
from op_calls import OpCalls

import tilegym.transformers
from tilegym.ops import moe
from tilegym.ops import moe_bias as mb
from tilegym.ops.attention import reference_mask
from tilegym.ops.attention_sinks import reference_attention_sinks

FOLDER = Path(tilegym.transformers.__file__).parent / "gpt_oss" / "kernel_definitions"


def _run(name: str):
    namespace: dict = {}
    definition = json.loads((FOLDER / f"{name}.json").read_text())
    exec(compile(definition["reference"], name, "exec"), namespace)  # noqa: S102
    return namespace["run"]


def test_attention_references_are_attention_with_sinks():
    torch.manual_seed(0)
    b, hq, hkv, d = 2, 8, 2, 64
    sinks = torch.randn(hq)
    for stage, sq, skv in (("prefill", 150, 150), ("decode", 1, 200)):
        q = torch.randn(b, hq, sq, d)
        k, v = torch.randn(b, hkv, skv, d), torch.randn(b, hkv, skv, d)
        for suffix, window in (("", None), ("_sliding", 128)):
            got = _run(f"gpt_oss_attention_{stage}{suffix}")(q, k, v, sinks)
            mask = reference_mask(b, sq, skv, window=window)
            want = reference_attention_sinks(q, k, v, mask, sinks, 0.125)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_router_reference_is_the_renormalized_route():
    logits = torch.randn(33, 32)
    weights, ids = _run("gpt_oss_router")(logits)
    want_w, want_ids = moe.moe_route_reference(logits, 4, True)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_w)


def test_expert_references_compose_to_the_biased_clamped_experts():
    torch.manual_seed(1)
    t, k, e, h, inter = 7, 4, 6, 16, 12
    x, res = torch.randn(t, h) * 3, torch.randn(t, h)
    ids = torch.stack([torch.randperm(e)[:k] for _ in range(t)]).to(torch.int32)
    weights = torch.softmax(torch.randn(t, k), -1)
    gu, gub = torch.randn(e, 2 * inter, h), torch.randn(e, 2 * inter) * 4
    down, db = torch.randn(e, h, inter), torch.randn(e, h)
    act = _run("gpt_oss_experts_gate_up_clamped")(x, ids, gu, gub)
    assert (act.abs() > 0).all()
    got = _run("gpt_oss_experts_down_bias_combine")(act, ids, weights, down, db, res)
    want = mb.moe_experts_bias_reference(x, ids, weights, gu, gub, down, db, res)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_rope_reference_is_upstreams_half_rotation_on_the_repeated_tables():
    """Upstream rotates by halves with head_dim / 2 wide YaRN tables; the glue hands the kernel
    those tables repeated. The Definition on the repeated tables is upstream's rotation, and is
    what the RoPE op computes on them."""
    from transformers import AutoConfig
    from transformers.models.gpt_oss import modeling_gpt_oss as upstream

    from tilegym.ops.library import apply_rope

    torch.manual_seed(2)
    config = AutoConfig.for_model("gpt_oss", head_dim=64, num_attention_heads=4)
    rotary = upstream.GptOssRotaryEmbedding(config)
    b, s = 3, 37
    positions = torch.randint(0, 9000, (b, s))
    cos, sin = rotary(torch.randn(1, dtype=torch.float64), positions)
    assert cos.shape == (b, s, 32)
    q, k = (
        torch.randn(b, 4, s, 64, dtype=torch.float64),
        torch.randn(b, 2, s, 64, dtype=torch.float64),
    )
    want = upstream.apply_rotary_pos_emb(q, k, cos, sin)
    cos2, sin2 = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    got = _run("gpt_oss_rope")(q, k, cos2, sin2)
    ops = apply_rope(q, k, cos2, sin2)
    for g, o, w in zip(got, ops, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(o, w, rtol=1e-12, atol=1e-12)
    # parity draws tables whose halves differ: the reference still computes the kernel's rotation
    cos3, sin3 = torch.randn_like(cos2), torch.randn_like(sin2)
    got, ops = _run("gpt_oss_rope")(q, k, cos3, sin3), apply_rope(q, k, cos3, sin3)
    for g, o in zip(got, ops, strict=True):
        torch.testing.assert_close(g, o, rtol=1e-12, atol=1e-12)


def _definitions_of(name, args, model) -> list[str]:
    """The Definitions one op call computes (which GEMM: by its weight; sliding: by its window)."""
    c = model.config
    if name == "linear":
        weights = {model.lm_head.weight.data_ptr(): "lm_head"}
        for layer in model.model.layers:
            weights[layer.self_attn.o_proj.weight.data_ptr()] = "o_proj"
            weights[layer.mlp.router.weight.data_ptr()] = "router"
        which = weights.get(args[1].data_ptr())
        if (
            which is None
            and args[1].shape[0] == (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
        ):
            which = "qkv"  # the packed q/k/v weight the patch built
        return [f"gpt_oss_linear_{which}"] if which else [f"unknown linear {tuple(args[1].shape)}"]
    if name in ("prefill_attention_sinks", "decode_attention_sinks"):
        stage = name.split("_")[0]
        return [f"gpt_oss_attention_{stage}" + ("_sliding" if args[7] is not None else "")]
    named = {
        "rms_norm": ["gpt_oss_rms_norm"],
        "add_rms_norm": ["gpt_oss_add_rms_norm"],
        "apply_rope": ["gpt_oss_rope"],
        "moe_route": ["gpt_oss_router"],
        "moe_experts_bias": [
            "gpt_oss_experts_gate_up_clamped",
            "gpt_oss_experts_down_bias_combine",
        ],
        "kv_cache_write_at": ["gpt_oss_kv_cache_update"],
        "kv_cache_ring_write": ["gpt_oss_kv_cache_update"],
        "rotary_tables": ["gpt_oss_rope_tables"],
    }
    return named.get(name, [f"unknown op {name}"])


def test_every_op_the_patched_model_calls_has_a_definition_and_every_definition_is_called():
    """Prefill and decode of a left-padded batch past the sliding window, with the default
    cache and with the static one (ring buffers): the Definitions hit are exactly the folder's."""
    _, patched, handle = patched_pair(
        "gpt_oss",
        num_hidden_layers=2,
        num_local_experts=8,
        num_experts_per_tok=2,
        sliding_window=4,
        intermediate_size=96,
    )
    assert "linear" in handle.applied and "attn" in handle.applied
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    hit = set()
    for cache in ({}, {"cache_implementation": "static"}):
        recorder = OpCalls()
        with recorder:
            greedy(patched, ids, mask, new_tokens=6, **cache)
        for name, args in recorder.calls:
            hit.update(_definitions_of(name, args, patched))
    assert hit == {p.stem for p in FOLDER.glob("*.json")}
