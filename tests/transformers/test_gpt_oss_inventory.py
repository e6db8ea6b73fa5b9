"""gpt-oss's Definitions compute what the ops' CPU references (and so the patched model) compute:
each gpt-oss-specific reference on small random inputs against ``tilegym.ops`` references
(attention with sinks, full and sliding; the top-4 route; the clamped experts' two halves on
the relaid weights)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

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
