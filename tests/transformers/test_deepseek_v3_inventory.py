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

import deepseek_inventory as inv
import pytest
import torch

from tilegym.ops import deepseek_route as dr

FAMILY = "deepseek_v3"

# ------------------------------------------------------------------ shapes and constants


def _expected_axes(c: dict) -> dict[str, dict[str, int]]:
    """The shared Definitions' const axes and V3's own: the q_a/q_b projections and q_a's
    norm."""
    h, heads, qr, lat = (
        c["hidden_size"],
        c["num_attention_heads"],
        c["q_lora_rank"],
        c["kv_lora_rank"],
    )
    r, n = c["qk_rope_head_dim"], c["qk_nope_head_dim"]
    return {
        **inv.shared_axes(FAMILY, c),
        "deepseek_v3_q_a_layernorm": {"H": qr},
        "deepseek_v3_linear_q_kv_a": {"K": h, "NQKV": qr + lat + r},
        "deepseek_v3_linear_q_b": {"K": qr, "NQ": heads * (n + r)},
    }


def test_every_definitions_const_axes_are_the_presets_widths():
    inv.check_const_axes(FAMILY, _expected_axes(inv.preset(FAMILY)))


def test_the_solutions_constants_are_the_preset_modules():
    inv.check_mla_scale(FAMILY)
    inv.check_solution_constants(FAMILY, norms=("deepseek_v3_q_a_layernorm",))
    d = inv.preset(FAMILY)
    assert d["rope_interleave"] and d["q_lora_rank"]  # the forms the Definitions describe


# ------------------------------------------------------------------ MLA


def test_decode_reference_is_the_latent_attention():
    inv.check_decode_reference(FAMILY, heads=8)


def test_absorbed_decode_references_compose_to_attention_over_the_expanded_keys():
    """absorb_query -> mla_decode -> latent_to_heads is the attention over keys and values
    expanded from the same latent through kv_b_proj (upstream's form)."""
    gen = inv.generator(1)
    b, h, t, n, v, lat, r = 2, 4, 9, 128, 128, 512, 64
    q_nope, q_pe = torch.randn(b, h, n, generator=gen), torch.randn(b, h, r, generator=gen)
    ckv, kpe = torch.randn(b, 1, t, lat, generator=gen), torch.randn(b, 1, t, r, generator=gen)
    w = torch.randn(h * (n + v), lat, generator=gen) * lat**-0.5
    q_lat = inv.reference(FAMILY, "deepseek_v3_mla_absorb_query")(q_nope, w)
    ctx = inv.reference(FAMILY, "deepseek_v3_mla_decode")(q_lat, q_pe, ckv, kpe)
    got = inv.reference(FAMILY, "deepseek_v3_mla_latent_to_heads")(ctx, w)
    kv = (ckv[:, 0] @ w.T).view(b, t, h, n + v).transpose(1, 2)
    k = torch.cat((kv[..., :n], kpe.expand(-1, h, -1, -1)), dim=-1)
    q = torch.cat((q_nope, q_pe), dim=-1)[:, :, None]
    scale = inv.entry_kwargs(FAMILY, "deepseek_v3_mla_decode")["scale"]
    probs = ((q @ k.transpose(-1, -2)) * scale).softmax(-1)
    want = (probs @ kv[..., n:])[:, :, 0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_prefill_reference_is_the_causal_mla_prefill():
    inv.check_prefill_reference(FAMILY, heads=4, seed=2)


def test_parity_draws_prefill_shapes_with_the_new_tokens_among_the_keys():
    inv.check_prefill_shapes(FAMILY)


# ------------------------------------------------------------------ RoPE and its tables


def test_rope_reference_on_the_permuted_rows_is_upstreams_interleaved_rotation():
    """Upstream rotates interleaved pairs; the patch permutes the rope rows (evens, then odds),
    and the Definition's half rotation of those rows is upstream's output, as is the RoPE
    op's, at the preset's YaRN tables. On tables whose halves differ (parity draws such) the
    reference still computes the op's rotation."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as upstream

    from tilegym.transformers.mla import rope_permutation

    gen = inv.generator(3)
    rotary = upstream.DeepseekV3RotaryEmbedding(inv.config(inv.preset(FAMILY)))
    b, s, h, r = 2, 7, 4, 64
    positions = torch.randint(0, 9000, (b, s), generator=gen)
    cos, sin = rotary(torch.ones(1, dtype=torch.float64), positions)
    q = torch.randn(b, h, s, r, dtype=torch.float64, generator=gen)
    k = torch.randn(b, 1, s, r, dtype=torch.float64, generator=gen)
    want = upstream.apply_rotary_pos_emb_interleave(q, k, cos, sin)
    perm = rope_permutation(r)
    inv.check_rope(FAMILY, q[..., perm], k[..., perm], cos, sin, want, rtol=1e-12, atol=1e-12)
    cos2, sin2 = torch.randn_like(cos), torch.randn_like(sin)
    inv.check_rope(FAMILY, q, k, cos2, sin2)


def test_rotary_tables_reference_is_the_preset_rotary_module():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

    rotary = DeepseekV3RotaryEmbedding(inv.config(inv.preset(FAMILY)))
    positions = torch.randint(0, 160000, (3, 17), generator=inv.generator(4))
    want = rotary(torch.ones(1, dtype=torch.bfloat16), positions)
    got = inv.reference(FAMILY, "deepseek_v3_rotary_tables")(positions, rotary.inv_freq)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype == torch.bfloat16
        torch.testing.assert_close(g, w, rtol=0, atol=0)


# ------------------------------------------------------------------ norms and GEMMs


def test_norm_references_are_the_upstream_module_and_the_op():
    norms = ("deepseek_v3_rms_norm", "deepseek_v3_q_a_layernorm", "deepseek_v3_kv_a_layernorm")
    inv.check_norm_references(FAMILY, norms, inv.generator(5))


def test_gemm_references_are_the_upstream_modules_and_the_ops():
    """The plain GEMMs are F.linear; the MLP Definitions (dense and shared expert) compose to
    DeepseekV3MLP plus the residual, each equal to its op on the packed [gate; up] weight."""
    gen = inv.generator(6)
    linears = (
        "deepseek_v3_linear_q_kv_a",
        "deepseek_v3_linear_q_b",
        "deepseek_v3_linear_kv_b",
        "deepseek_v3_linear_lm_head",
    )
    inv.check_gemms(FAMILY, linears, gen)
    x, w = torch.randn(5, 64, generator=gen), torch.randn(24, 64, generator=gen)
    res = torch.randn(5, 24, generator=gen)
    got = inv.reference(FAMILY, "deepseek_v3_linear_o_proj_residual")(x, w, res)
    torch.testing.assert_close(got, res + torch.nn.functional.linear(x, w))


def test_expert_references_compose_to_the_upstream_experts_and_the_op():
    """The gate/up Definition's activations through the down/combine Definition (fp32 routing
    weights, the residual) are the residual plus transformers' DeepseekV3Experts output, and
    the moe_experts op's reference."""
    inv.check_expert_stages(FAMILY, weight_scale=2.5)


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
    c = inv.preset(FAMILY)
    rc = _routing_config(c)
    e, k = rc["n_routed_experts"], rc["num_experts_per_tok"]
    gen = inv.generator(8)
    bias = torch.randn(e, generator=gen) * 0.3
    router = _upstream_router(c["hidden_size"], bias, num_attention_heads=1, **rc)
    with torch.no_grad():
        router.weight.normal_(0, 0.05, generator=gen)
        x = torch.randn(64, c["hidden_size"], generator=gen)
        want_logits, want_w, want_ids = router(x)
    logits = inv.reference(FAMILY, "deepseek_v3_router_logits")(x, router.weight.detach())
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
    c = _routing_config(inv.preset(FAMILY))
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
    gen = inv.generator(9)
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
    inv.check_cpu_parity(FAMILY, name, inv.cpu_path(FAMILY, name), n_shapes=2)


# ------------------------------------------------------------------ completeness


def _weights(model) -> dict[int, str]:
    """The Definition of each op that reads one of the model's own weights, by the weight (the
    router's weight: the router logits')."""
    out = inv.model_weights(FAMILY, model, "deepseek_v3_router_logits")
    for layer in model.model.layers:
        out[layer.self_attn.q_a_layernorm.weight.data_ptr()] = "deepseek_v3_q_a_layernorm"
    return out


def _definitions_of(name: str, args, model, weights: dict[int, str]) -> list[str]:
    """The Definitions one op call computes: the router logits by the router's weight; the
    weights the patch built (the first projection, the permuted q_b_proj) by their shape; the
    rest as both families'."""
    c = model.config
    q_kv_a = (c.q_lora_rank + c.kv_lora_rank + c.qk_rope_head_dim, c.hidden_size)
    q_b = (c.num_attention_heads * c.qk_head_dim, c.q_lora_rank)
    built = {q_kv_a: "deepseek_v3_linear_q_kv_a", q_b: "deepseek_v3_linear_q_b"}
    return inv.definitions_of(FAMILY, name, args, model, weights, built, ("router_logits",))


def test_every_op_the_patched_model_calls_has_a_definition_and_every_definition_is_called():
    """The tiny-deepseek_v3 preset (a dense layer, a sparse one; fp32 on the CPU): prefill and
    decode of a left-padded batch with the default cache and with the static one. The
    Definitions hit are exactly the folder's."""
    from transformers import AutoModelForCausalLM

    d = inv.preset("tiny-deepseek_v3")
    torch.manual_seed(0)
    cfg = inv.config(d, d["num_hidden_layers"])
    model = AutoModelForCausalLM.from_config(cfg).eval().float()
    hit = inv.hits(model, ({}, {"cache_implementation": "static"}), _weights, _definitions_of)
    assert hit == inv.definition_names(FAMILY)
