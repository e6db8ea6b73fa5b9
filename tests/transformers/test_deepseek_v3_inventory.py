"""DeepSeek-V3's Definitions compute what the ops' CPU references (and so the patched model)
compute, at the ``deepseek_v3`` preset's shapes and constants, and the inventory is complete.

- Shapes and constants: every Definition's const axes are the preset's widths; the Solutions'
  softmax scale is the attention module's ``scaling`` (YaRN's mscale included), the tables'
  scaling the rotary module's ``attention_scaling``, the norms' eps the config's.
- References against ``tilegym.ops``' references and transformers' modules on small random
  inputs: MLA prefill and absorbed decode, the interleaved RoPE on the permuted rope rows, the
  rotary tables, the norms, the GEMMs (with residual, with SiLU-and-mul), the routed experts'
  two stages; and the parity harness on the CPU, the patched model's CPU path in the Solution's
  place, for the ops whose preset-sized inputs fit the CPU (absorbed products, router logits,
  latent cache write, RoPE and its tables, the norms).
- The router: the Definition covers the fp32 logits only. The routing after them (sigmoid,
  ``e_score_correction_bias``, group limits, renormalization, scaling) is
  ``tilegym.ops.deepseek_route.deepseek_v3_route`` in PyTorch, no cuTile op and so no
  Definition; it is checked here against transformers' router on the Definition's logits,
  with group limits that bind and with ties (in scores and in group scores).
- Completeness: every cuTile op the patched tiny-deepseek_v3 model calls (fp32, CPU), prefill
  and decode, default and static cache, maps to a Definition, and every Definition is called.
  transformers 5.24 (unlike 5.17) keeps a bf16 model's router weight in fp32; the patched
  router then keeps upstream's fp32 linear and ``deepseek_v3_router_logits`` is not called.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from cpu_generate import greedy, left_padded_batch
from op_calls import OpCalls

import tilegym.transformers
from tilegym.ops import deepseek_route as dr
from tilegym.ops import mla, moe
from tilegym.ops.attention import reference_mask

ROOT = Path(tilegym.transformers.__file__).parent / "deepseek_v3"
DEFINITIONS = ROOT / "kernel_definitions"
SOLUTIONS = ROOT / "kernel_solutions"


def _json(folder: Path, name: str) -> dict:
    return json.loads((folder / f"{name}.json").read_text())


def _run(name: str):
    namespace: dict = {}
    exec(compile(_json(DEFINITIONS, name)["reference"], name, "exec"), namespace)  # noqa: S102
    return namespace["run"]


def _definition(name: str):
    from tilegym.kernel_inventory.models import Definition

    return Definition.from_dict(_json(DEFINITIONS, name))


def _kwargs(name: str) -> dict:
    return _json(SOLUTIONS, name)["spec"].get("entry_kwargs", {})


def _preset(key: str = "deepseek_v3") -> dict:
    from tilegym_hf_bench.presets import PRESETS, config_dict

    return config_dict(PRESETS[key])


def _config(d: dict, layers: int = 1):
    from transformers import AutoConfig

    return AutoConfig.for_model(**dict(d, num_hidden_layers=layers))


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------ shapes and constants


def _expected_axes(c: dict) -> dict[str, dict[str, int]]:
    h, heads, qr, lat = (
        c["hidden_size"],
        c["num_attention_heads"],
        c["q_lora_rank"],
        c["kv_lora_rank"],
    )
    r, n, v = c["qk_rope_head_dim"], c["qk_nope_head_dim"], c["v_head_dim"]
    inter, mi, e, k = (
        c["intermediate_size"],
        c["moe_intermediate_size"],
        c["n_routed_experts"],
        c["num_experts_per_tok"],
    )
    shared = mi * c["n_shared_experts"]
    return {
        "deepseek_v3_rms_norm": {"H": h},
        "deepseek_v3_q_a_layernorm": {"H": qr},
        "deepseek_v3_kv_a_layernorm": {"H": lat},
        "deepseek_v3_linear_q_kv_a": {"K": h, "NQKV": qr + lat + r},
        "deepseek_v3_linear_q_b": {"K": qr, "NQ": heads * (n + r)},
        "deepseek_v3_linear_kv_b": {"K": lat, "NKV": heads * (n + v)},
        "deepseek_v3_linear_o_proj_residual": {"Q": heads * v, "H": h},
        "deepseek_v3_linear_gate_up_silu": {"H": h, "I2": 2 * inter, "I": inter},
        "deepseek_v3_linear_down_residual": {"I": inter, "H": h},
        "deepseek_v3_shared_experts_gate_up_silu": {"H": h, "I2": 2 * shared, "I": shared},
        "deepseek_v3_shared_experts_down_residual": {"I": shared, "H": h},
        "deepseek_v3_linear_lm_head": {"H": h, "V": c["vocab_size"]},
        "deepseek_v3_rope": {"HQ": heads, "HK": 1, "D": r},
        "deepseek_v3_rotary_tables": {"RH": r // 2, "R": r},
        "deepseek_v3_mla_prefill": {"H": heads, "N": n, "R": r, "V": v, "ONE": 1},
        "deepseek_v3_mla_decode": {"H": heads, "L": lat, "R": r, "ONE": 1},
        "deepseek_v3_mla_absorb_query": {"H": heads, "N": n, "L": lat, "HNV": heads * (n + v)},
        "deepseek_v3_mla_latent_to_heads": {"H": heads, "L": lat, "V": v, "HNV": heads * (n + v)},
        "deepseek_v3_latent_cache_update": {"ONE": 1, "L": lat, "R": r},
        "deepseek_v3_router_logits": {"H": h, "E": e},
        "deepseek_v3_experts_gate_up_silu": {"K": k, "E": e, "H": h, "I2": 2 * mi, "I": mi},
        "deepseek_v3_experts_down_combine": {"K": k, "E": e, "H": h, "I": mi},
    }


def test_every_definitions_const_axes_are_the_presets_widths():
    cfg = _preset()
    expected = _expected_axes(cfg)
    assert set(expected) == {p.stem for p in DEFINITIONS.glob("*.json")}
    assert {p.stem for p in SOLUTIONS.glob("*.json")} == set(expected)
    for name, axes in expected.items():
        definition = _definition(name)
        const = {a: x.value for a, x in definition.axes.items() if x.kind == "const"}
        assert const == axes, name
        floats = [
            s.dtype
            for s in (*definition.inputs.values(), *definition.outputs.values())
            if s.dtype.startswith(("bfloat", "float"))
        ]
        model_dtype = [d for d in floats if d != "float32"]
        assert model_dtype and set(model_dtype) == {cfg["torch_dtype"]}, name


def test_the_solutions_constants_are_the_preset_modules():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
        DeepseekV3RotaryEmbedding,
    )

    d = _preset()
    cfg = _config(d)
    scaling = DeepseekV3Attention(cfg, 0).scaling
    assert scaling != cfg.qk_head_dim**-0.5  # YaRN's mscale_all_dim counts
    for name in ("deepseek_v3_mla_decode", "deepseek_v3_mla_prefill"):
        assert _kwargs(name) == {"scale": scaling}
    rotary = DeepseekV3RotaryEmbedding(cfg)
    assert _kwargs("deepseek_v3_rotary_tables") == {
        "scaling": rotary.attention_scaling,
        "dtype": d["torch_dtype"],
    }
    assert rotary.inv_freq.shape[0] == _definition("deepseek_v3_rotary_tables").axes["RH"].value
    assert _kwargs("deepseek_v3_mla_latent_to_heads") == {"v_dim": d["v_head_dim"]}
    for name in ("deepseek_v3_rms_norm", "deepseek_v3_q_a_layernorm", "deepseek_v3_kv_a_layernorm"):
        assert _kwargs(name) == {"eps": d["rms_norm_eps"]}
    assert d["rope_interleave"] and d["q_lora_rank"]  # the forms the Definitions describe


# ------------------------------------------------------------------ MLA


def test_decode_reference_is_the_latent_attention():
    gen = _gen(0)
    b, h, t = 2, 8, 37
    ql, qp = torch.randn(b, h, 512, generator=gen) * 0.05, torch.randn(b, h, 64, generator=gen)
    ckv, kpe = torch.randn(b, 1, t, 512, generator=gen), torch.randn(b, 1, t, 64, generator=gen)
    scale = _kwargs("deepseek_v3_mla_decode")["scale"]
    got = _run("deepseek_v3_mla_decode")(ql, qp, ckv, kpe)
    want = mla.reference_mla_decode(ql, qp, ckv, kpe, torch.ones(b, t, dtype=torch.bool), scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_absorbed_decode_references_compose_to_attention_over_the_expanded_keys():
    """absorb_query -> mla_decode -> latent_to_heads is the attention over keys and values
    expanded from the same latent through kv_b_proj (upstream's form)."""
    gen = _gen(1)
    b, h, t, n, v, lat, r = 2, 4, 9, 128, 128, 512, 64
    q_nope, q_pe = torch.randn(b, h, n, generator=gen), torch.randn(b, h, r, generator=gen)
    ckv, kpe = torch.randn(b, 1, t, lat, generator=gen), torch.randn(b, 1, t, r, generator=gen)
    w = torch.randn(h * (n + v), lat, generator=gen) * lat**-0.5
    q_lat = _run("deepseek_v3_mla_absorb_query")(q_nope, w)
    ctx = _run("deepseek_v3_mla_decode")(q_lat, q_pe, ckv, kpe)
    got = _run("deepseek_v3_mla_latent_to_heads")(ctx, w)
    kv = (ckv[:, 0] @ w.T).view(b, t, h, n + v).transpose(1, 2)
    k = torch.cat((kv[..., :n], kpe.expand(-1, h, -1, -1)), dim=-1)
    q = torch.cat((q_nope, q_pe), dim=-1)[:, :, None]
    probs = ((q @ k.transpose(-1, -2)) * _kwargs("deepseek_v3_mla_decode")["scale"]).softmax(-1)
    want = (probs @ kv[..., n:])[:, :, 0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_prefill_reference_is_the_causal_mla_prefill():
    gen = _gen(2)
    b, h, s, t = 2, 4, 9, 13
    qn, qp = torch.randn(b, h, s, 128, generator=gen), torch.randn(b, h, s, 64, generator=gen)
    kn, kp = torch.randn(b, h, t, 128, generator=gen), torch.randn(b, 1, t, 64, generator=gen)
    v = torch.randn(b, h, t, 128, generator=gen)
    scale = _kwargs("deepseek_v3_mla_prefill")["scale"]
    got = _run("deepseek_v3_mla_prefill")(qn, qp, kn, kp, v)
    want = mla.reference_mla_prefill(qn, qp, kn, kp, v, reference_mask(b, s, t), scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_parity_draws_prefill_shapes_with_the_new_tokens_among_the_keys():
    from tilegym.kernel_inventory.parity import sample_shapes

    shapes = sample_shapes(_definition("deepseek_v3_mla_prefill"), 32, random.Random(0))
    assert shapes and all(b["S"] <= b["T"] for b in shapes)


# ------------------------------------------------------------------ RoPE and its tables


def test_rope_reference_on_the_permuted_rows_is_upstreams_interleaved_rotation():
    """Upstream rotates interleaved pairs; the patch permutes the rope rows (evens, then odds),
    and the Definition's half rotation of those rows is upstream's output, as is the RoPE
    op's, at the preset's YaRN tables. On tables whose halves differ (parity draws such) the
    reference still computes the op's rotation."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as upstream

    from tilegym.ops.library import apply_rope
    from tilegym.transformers.mla import rope_permutation

    gen = _gen(3)
    rotary = upstream.DeepseekV3RotaryEmbedding(_config(_preset()))
    b, s, h, r = 2, 7, 4, 64
    positions = torch.randint(0, 9000, (b, s), generator=gen)
    cos, sin = rotary(torch.ones(1, dtype=torch.float64), positions)
    q = torch.randn(b, h, s, r, dtype=torch.float64, generator=gen)
    k = torch.randn(b, 1, s, r, dtype=torch.float64, generator=gen)
    want = upstream.apply_rotary_pos_emb_interleave(q, k, cos, sin)
    perm = rope_permutation(r)
    got = _run("deepseek_v3_rope")(q[..., perm], k[..., perm], cos, sin)
    ops = apply_rope(q[..., perm], k[..., perm], cos, sin)
    for g, o, w in zip(got, ops, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(o, w, rtol=1e-12, atol=1e-12)
    cos2, sin2 = torch.randn_like(cos), torch.randn_like(sin)
    got, ops = _run("deepseek_v3_rope")(q, k, cos2, sin2), apply_rope(q, k, cos2, sin2)
    for g, o in zip(got, ops, strict=True):
        torch.testing.assert_close(g, o, rtol=1e-12, atol=1e-12)


def test_rotary_tables_reference_is_the_preset_rotary_module():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

    rotary = DeepseekV3RotaryEmbedding(_config(_preset()))
    positions = torch.randint(0, 160000, (3, 17), generator=_gen(4))
    want = rotary(torch.ones(1, dtype=torch.bfloat16), positions)
    got = _run("deepseek_v3_rotary_tables")(positions, rotary.inv_freq)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype == torch.bfloat16
        torch.testing.assert_close(g, w, rtol=0, atol=0)


# ------------------------------------------------------------------ norms and GEMMs


def test_norm_references_are_the_upstream_module_and_the_op():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm

    from tilegym.ops.library import rms_norm

    gen = _gen(5)
    for name in ("deepseek_v3_rms_norm", "deepseek_v3_q_a_layernorm", "deepseek_v3_kv_a_layernorm"):
        width = _definition(name).axes["H"].value
        norm = DeepseekV3RMSNorm(width, eps=_kwargs(name)["eps"])
        with torch.no_grad():
            norm.weight.normal_(1.0, 0.2, generator=gen)
            x = torch.randn(5, width, generator=gen)
            got = _run(name)(x, norm.weight)
            torch.testing.assert_close(got, norm(x))
            torch.testing.assert_close(got, rms_norm(x, norm.weight, _kwargs(name)["eps"]))


def test_gemm_references_are_the_upstream_modules_and_the_ops():
    """The plain GEMMs are F.linear; the MLP Definitions (dense and shared expert) compose to
    DeepseekV3MLP plus the residual, each equal to its op on the packed [gate; up] weight."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MLP

    from tilegym.ops import library

    gen = _gen(6)
    x, w = torch.randn(5, 48, generator=gen), torch.randn(40, 48, generator=gen)
    for name in (
        "deepseek_v3_linear_q_kv_a",
        "deepseek_v3_linear_q_b",
        "deepseek_v3_linear_kv_b",
        "deepseek_v3_linear_lm_head",
    ):
        torch.testing.assert_close(_run(name)(x, w), torch.nn.functional.linear(x, w))
        torch.testing.assert_close(_run(name)(x, w), library.linear(x, w))
    cfg = _config(dict(_preset("tiny-deepseek_v3"), hidden_size=32, intermediate_size=24))
    pairs = (
        ("deepseek_v3_linear_gate_up_silu", "deepseek_v3_linear_down_residual"),
        ("deepseek_v3_shared_experts_gate_up_silu", "deepseek_v3_shared_experts_down_residual"),
    )
    for gate_up, down in pairs:
        mlp = DeepseekV3MLP(cfg)
        with torch.no_grad():
            for p in mlp.parameters():
                p.normal_(0, 0.3, generator=gen)
            x, res = torch.randn(7, 32, generator=gen), torch.randn(7, 32, generator=gen)
            packed = torch.cat((mlp.gate_proj.weight, mlp.up_proj.weight))
            act = _run(gate_up)(x, packed)
            torch.testing.assert_close(act, library.fused_gate_up_silu(x, packed))
            got = _run(down)(act, mlp.down_proj.weight, res)
            torch.testing.assert_close(got, res + mlp(x))
            torch.testing.assert_close(got, library.linear_residual(act, mlp.down_proj.weight, res))
    x, w = torch.randn(5, 64, generator=gen), torch.randn(24, 64, generator=gen)
    res = torch.randn(5, 24, generator=gen)
    got = _run("deepseek_v3_linear_o_proj_residual")(x, w, res)
    torch.testing.assert_close(got, res + torch.nn.functional.linear(x, w))


def test_expert_references_compose_to_the_upstream_experts_and_the_op():
    """The gate/up Definition's activations through the down/combine Definition (fp32 routing
    weights, the residual) are the residual plus transformers' DeepseekV3Experts output, and
    the moe_experts op's reference."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Experts

    from tilegym.ops import library

    gen = _gen(7)
    cfg = _config(dict(_preset("tiny-deepseek_v3"), hidden_size=32, n_routed_experts=6))
    experts = DeepseekV3Experts(cfg)
    with torch.no_grad():
        experts.gate_up_proj.normal_(0, 0.2, generator=gen)
        experts.down_proj.normal_(0, 0.2, generator=gen)
    t, k = 7, 3
    x, res = torch.randn(t, 32, generator=gen), torch.randn(t, 32, generator=gen)
    ids = torch.stack([torch.randperm(6, generator=gen)[:k] for _ in range(t)]).to(torch.int32)
    w = torch.rand(t, k, generator=gen) * 2.5
    gu, down = experts.gate_up_proj.detach(), experts.down_proj.detach()
    act = _run("deepseek_v3_experts_gate_up_silu")(x, ids, gu)
    got = _run("deepseek_v3_experts_down_combine")(act, ids, w, down, res)
    with torch.no_grad():
        torch.testing.assert_close(got, res + experts(x, ids.long(), w), rtol=1e-5, atol=1e-5)
    want = moe.moe_experts_reference(x, ids, w, gu, down, res)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, library.moe_experts(x, ids, w, gu, down, res))


# ------------------------------------------------------------------ the router


def _upstream_router(hidden: int, bias: torch.Tensor, **cfg):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    router = DeepseekV3TopkRouter(DeepseekV3Config(hidden_size=hidden, **cfg))
    with torch.no_grad():
        router.e_score_correction_bias.copy_(bias)
    return router


def _dense(weights, ids, e):
    return dr.dense_weights(weights.float(), ids, e)


def _routing_config(d: dict) -> dict:
    keys = ("n_routed_experts", "num_experts_per_tok", "n_group", "topk_group")
    keys += ("norm_topk_prob", "routed_scaling_factor")
    return {key: d[key] for key in keys}


def _route(logits, bias, c):
    return dr.deepseek_v3_route(
        logits,
        bias,
        top_k=c["num_experts_per_tok"],
        n_group=c["n_group"],
        topk_group=c["topk_group"],
        renormalize=c["norm_topk_prob"],
        scaling=c["routed_scaling_factor"],
    )


def test_router_logits_then_the_pytorch_route_are_the_upstream_router_with_group_limits():
    """At the preset's router (32 experts, 8 groups keeping 4, top 8, renormalized, x 2.5) and
    hidden size: the Definition's logits are the router's, and the route after them is its
    routing; the group limit binds (some token's best 8 biased scores span a dropped group)."""
    c = _preset()
    rc = _routing_config(c)
    e, k = rc["n_routed_experts"], rc["num_experts_per_tok"]
    gen = _gen(8)
    bias = torch.randn(e, generator=gen) * 0.3
    router = _upstream_router(c["hidden_size"], bias, num_attention_heads=1, **rc)
    with torch.no_grad():
        router.weight.normal_(0, 0.05, generator=gen)
        x = torch.randn(64, c["hidden_size"], generator=gen)
        want_logits, want_w, want_ids = router(x)
    logits = _run("deepseek_v3_router_logits")(x, router.weight.detach())
    torch.testing.assert_close(logits, want_logits)
    weights, ids = _route(logits, bias, rc)
    torch.testing.assert_close(dr.dense_weights(weights, ids, e), _dense(want_w, want_ids, e))
    greedy_ids = dr.top_indices(logits.sigmoid() + bias, k)
    chosen = torch.zeros(64, e, dtype=torch.bool).scatter_(1, ids.long(), True)
    unlimited = torch.zeros(64, e, dtype=torch.bool).scatter_(1, greedy_ids, True)
    assert (chosen != unlimited).any(dim=1).any()


def test_the_route_breaks_ties_to_the_lower_index_and_keeps_upstreams_weights():
    """Tied scores and tied group scores at the cut (integer logits, no bias): the route keeps
    the lower-index groups and, among tied experts, the lower index; where the groups do not
    tie at the cut, its weights are upstream's as a multiset (upstream's unordered top-k leaves
    the tied index to the implementation)."""
    c = _routing_config(_preset())
    e, k, groups, keep = (
        c["n_routed_experts"],
        c["num_experts_per_tok"],
        c["n_group"],
        c["topk_group"],
    )
    per = e // groups
    bias = torch.zeros(e)
    router = _upstream_router(e, bias, num_attention_heads=1, **c)
    with torch.no_grad():
        router.weight.copy_(torch.eye(e))
    gen = _gen(9)
    logits = torch.randint(-2, 3, (200, e), generator=gen).float()
    logits[0] = 0.0  # every expert and every group tied
    with torch.no_grad():
        _, want_w, _ = router(logits)
    weights, ids = _route(logits, bias, c)
    scores = logits.sigmoid()
    group_scores = scores.view(-1, groups, per).topk(2, dim=-1).values.sum(-1)
    ties = 0
    for row in range(logits.shape[0]):
        order = torch.sort(group_scores[row], descending=True, stable=True).indices
        kept = order[:keep]
        if group_scores[row, order[keep - 1]] == group_scores[row, order[keep]]:
            ties += 1  # upstream's tied groups are its own choice: their experts may differ
        else:  # the same groups: tied experts at the cut may differ, their scores cannot
            got, want = weights[row].sort().values, want_w[row].float().sort().values
            torch.testing.assert_close(got, want)
        allowed = torch.zeros(e, dtype=torch.bool)
        for g in kept.tolist():
            allowed[g * per : (g + 1) * per] = True
        candidates = torch.where(allowed, scores[row], float("-inf"))
        want = torch.sort(candidates, descending=True, stable=True).indices[:k]
        assert ids[row].tolist() == want.tolist()
    assert 0 < ties < logits.shape[0]  # some rows tie at the group cut, some do not
    assert ids[0].tolist() == list(range(k))  # all tied: the lowest groups' lowest experts


# ------------------------------------------------------------------ parity on the CPU


def _split(kv_b_weight, heads, v_dim=128):
    return mla.split_kv_b_weight(kv_b_weight, heads, kv_b_weight.shape[0] // heads - v_dim, v_dim)


def _cpu_path(name: str):
    """What the patched model runs on the CPU for the Definition's op (the library's custom
    ops' CPU implementations), taking the Definition's tensors as the Solution's entry point."""
    from tilegym.ops import library

    kw = _kwargs(name)
    if name == "deepseek_v3_mla_absorb_query":
        return lambda q, w: library.mla_absorb_query(q, _split(w, q.shape[1])[0])
    if name == "deepseek_v3_mla_latent_to_heads":
        return lambda c, w: library.mla_latent_to_heads(c, _split(w, c.shape[1], kw["v_dim"])[1])
    if name == "deepseek_v3_router_logits":
        return library.router_logits
    if name == "deepseek_v3_rotary_tables":
        return lambda pos, inv: library.rotary_tables(
            pos, inv, kw["scaling"], getattr(torch, kw["dtype"])
        )
    if name == "deepseek_v3_rope":
        return library.apply_rope
    if "eps" in kw:
        return lambda x, w: library.rms_norm(x, w, kw["eps"])

    def write(k, v, kc, vc):
        pos, length = torch.zeros(1, dtype=torch.int32), torch.zeros((), dtype=torch.int64)
        library.latent_cache_write_at(k, v, kc, vc, pos, length)

    return write


CPU_PARITY = [
    "deepseek_v3_mla_absorb_query",
    "deepseek_v3_mla_latent_to_heads",
    "deepseek_v3_router_logits",
    "deepseek_v3_latent_cache_update",
    "deepseek_v3_rotary_tables",
    "deepseek_v3_rope",
    "deepseek_v3_rms_norm",
    "deepseek_v3_q_a_layernorm",
    "deepseek_v3_kv_a_layernorm",
]


@pytest.mark.parametrize("name", CPU_PARITY)
def test_references_are_what_the_patched_model_computes_on_the_cpu(name):
    """The parity harness on the CPU (fresh random inputs at the Definition's preset shapes,
    fp64 reference) with the model's CPU path in the Solution's place."""
    from tilegym.kernel_inventory.parity import check_parity

    dps = _json(SOLUTIONS, name)["spec"]["destination_passing_style"]
    issues = check_parity(
        _definition(name), _cpu_path(name), device="cpu", destination_passing_style=dps, n_shapes=2
    )
    assert issues == []


# ------------------------------------------------------------------ completeness


def _weights(model) -> dict[int, str]:
    """The Definition of each op that reads one of the model's own weights, by the weight."""
    out = {model.lm_head.weight.data_ptr(): "deepseek_v3_linear_lm_head"}
    out[model.model.norm.weight.data_ptr()] = "deepseek_v3_rms_norm"
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            out[norm.weight.data_ptr()] = "deepseek_v3_rms_norm"
        out[attn.q_a_layernorm.weight.data_ptr()] = "deepseek_v3_q_a_layernorm"
        out[attn.kv_a_layernorm.weight.data_ptr()] = "deepseek_v3_kv_a_layernorm"
        out[attn.kv_b_proj.weight.data_ptr()] = "deepseek_v3_linear_kv_b"
        out[attn.o_proj.weight.data_ptr()] = "deepseek_v3_linear_o_proj_residual"
        if hasattr(mlp, "experts"):
            out[mlp.gate.weight.data_ptr()] = "deepseek_v3_router_logits"
            down = mlp.shared_experts.down_proj.weight
            out[down.data_ptr()] = "deepseek_v3_shared_experts_down_residual"
        else:
            out[mlp.down_proj.weight.data_ptr()] = "deepseek_v3_linear_down_residual"
    return out


def _definitions_of(name: str, args, model, weights: dict[int, str]) -> list[str]:
    """The Definitions one op call computes: by the model weight it reads, else (the weights
    the patch built: the first projection, the permuted q_b_proj, the packed [gate; up]) by
    the weight's shape."""
    c = model.config
    if name in ("linear", "linear_residual", "rms_norm", "router_logits"):
        which = weights.get(args[1].data_ptr())
        shape = tuple(args[1].shape)
        if which is None and name == "linear":
            q_kv_a = (c.q_lora_rank + c.kv_lora_rank + c.qk_rope_head_dim, c.hidden_size)
            q_b = (c.num_attention_heads * c.qk_head_dim, c.q_lora_rank)
            which = {q_kv_a: "deepseek_v3_linear_q_kv_a", q_b: "deepseek_v3_linear_q_b"}.get(shape)
        return [which or f"unknown {name} {shape}"]
    if name == "fused_gate_up_silu":
        shared = c.moe_intermediate_size * c.n_shared_experts
        rows = {
            2 * c.intermediate_size: "deepseek_v3_linear_gate_up_silu",
            2 * shared: "deepseek_v3_shared_experts_gate_up_silu",
        }
        return [rows.get(args[1].shape[0], f"unknown gate/up {tuple(args[1].shape)}")]
    named = {
        "apply_rope": ["deepseek_v3_rope"],
        "rotary_tables": ["deepseek_v3_rotary_tables"],
        "mla_prefill": ["deepseek_v3_mla_prefill"],
        "mla_decode": ["deepseek_v3_mla_decode"],
        "mla_absorb_query": ["deepseek_v3_mla_absorb_query"],
        "mla_latent_to_heads": ["deepseek_v3_mla_latent_to_heads"],
        "latent_cache_write_at": ["deepseek_v3_latent_cache_update"],
        "moe_experts": ["deepseek_v3_experts_gate_up_silu", "deepseek_v3_experts_down_combine"],
    }
    return named.get(name, [f"unknown op {name}"])


def test_every_op_the_patched_model_calls_has_a_definition_and_every_definition_is_called():
    """The tiny-deepseek_v3 preset (a dense layer, a sparse one; fp32 on the CPU): prefill and
    decode of a left-padded batch with the default cache and with the static one. The
    Definitions hit are exactly the folder's."""
    from transformers import AutoModelForCausalLM

    from tilegym.transformers import monkey_patch as mp

    d = _preset("tiny-deepseek_v3")
    torch.manual_seed(0)
    cfg = _config(d, d["num_hidden_layers"])
    model = AutoModelForCausalLM.from_config(cfg).eval().float()
    handle = mp.apply_tilegym_kernel(model)
    assert set(handle.applied) == {"rope", "rms_norm", "swiglu", "attn", "linear"}
    shared = cfg.moe_intermediate_size * cfg.n_shared_experts
    assert cfg.intermediate_size != shared  # the two gate/up GEMMs tell apart by their rows
    weights = _weights(model)
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    hit: set[str] = set()
    for cache in ({}, {"cache_implementation": "static"}):
        recorder = OpCalls()
        with recorder:
            greedy(model, ids, mask, new_tokens=4, **cache)
        for name, args in recorder.calls:
            hit.update(_definitions_of(name, args, model, weights))
    assert hit == {p.stem for p in DEFINITIONS.glob("*.json")}
