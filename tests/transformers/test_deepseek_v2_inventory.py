"""DeepSeek-V2's Definitions compute what the ops' references (and so the patched model)
compute, at the ``deepseek_v2`` preset's shapes and constants (DeepSeek-V2-Lite's widths), and
the inventory is complete.

- Shapes and constants: every Definition's const axes are the preset's widths; the Solutions'
  softmax scale is the attention module's ``scaling`` (YaRN's mscale included), the tables'
  scaling the rotary module's ``attention_scaling``, the router's top-k and scaling the
  config's.
- References against ``tilegym.ops``' references and transformers' modules on small random
  inputs: MLA prefill and absorbed decode, the RoPE on the permuted rope rows against
  upstream's complex rotation at the preset's YaRN table, the norms, the GEMMs (with residual,
  with SiLU-and-mul: the dense MLP and the shared experts, the lm_head), the routed experts'
  two stages, the greedy router against transformers' router; and the parity harness on the
  CPU, the patched model's CPU path in the Solution's place, for the ops whose preset-sized
  inputs fit the CPU (absorbed products, router, latent cache write, RoPE and its tables).
- Completeness: every cuTile op the patched tiny-deepseek_v2 model calls (fp32, CPU), prefill
  and decode, default and static cache, maps to a Definition, and every Definition is called:
  the Lite's greedy router is one op (``deepseek_v2_router``); the router logits alone
  (``deepseek_v2_router_logits``) are what the group-limited router (DeepSeek-V2's, not the
  Lite's) takes, so a group-limited twin of the tiny model calls that one; a router weight kept
  in fp32 in a bf16 model (transformers 5.24 keeps it so, as the benchmark builds the model)
  leaves upstream's fp32 linear in PyTorch and routes its logits on the shared route kernel
  (``deepseek_v2_route``), so a bf16 twin with an fp32 router weight calls that one.
"""

from __future__ import annotations

import deepseek_inventory as inv
import pytest
import torch

FAMILY = "deepseek_v2"

# ------------------------------------------------------------------ shapes and constants


def _expected_axes(c: dict) -> dict[str, dict[str, int]]:
    """The shared Definitions' const axes and the Lite's own: its first projection (q_proj's
    rows, no q_a/q_b), the greedy router and the route."""
    h, heads, lat = c["hidden_size"], c["num_attention_heads"], c["kv_lora_rank"]
    r, n = c["qk_rope_head_dim"], c["qk_nope_head_dim"]
    e, k = c["n_routed_experts"], c["num_experts_per_tok"]
    return {
        **inv.shared_axes(FAMILY, c),
        "deepseek_v2_linear_q_kv_a": {"K": h, "NQKV": heads * (n + r) + lat + r},
        "deepseek_v2_router": {"H": h, "E": e},
        "deepseek_v2_route": {"E": e, "K": k},
    }


#: the route after upstream's fp32 router linear: fp32 logits in, fp32 weights out
FP32_ONLY = frozenset({"deepseek_v2_route"})


def test_every_definitions_const_axes_are_the_presets_widths():
    cfg = inv.preset(FAMILY)
    inv.check_const_axes(FAMILY, _expected_axes(cfg), FP32_ONLY)
    assert cfg["q_lora_rank"] is None  # q_proj, no q_a/q_b: the forms the Definitions describe
    assert not cfg["tie_word_embeddings"]  # the lm_head's own weight


def test_the_solutions_scale_is_the_lite_modules_scaling():
    inv.check_mla_scale(FAMILY)


def test_decode_reference_is_the_latent_attention():
    inv.check_decode_reference(FAMILY, heads=16)


def test_prefill_reference_is_the_causal_mla_prefill():
    inv.check_prefill_reference(FAMILY, heads=16, seed=1)


def test_norm_and_linear_references_are_the_upstream_modules():
    gen = inv.generator(2)
    inv.check_norm_references(FAMILY, ("deepseek_v2_rms_norm", "deepseek_v2_kv_a_layernorm"), gen)
    x, res = torch.randn(5, 2048, generator=gen), torch.randn(5, 2048, generator=gen)
    w = torch.randn(2048, 2048, generator=gen) * 0.02
    got = inv.reference(FAMILY, "deepseek_v2_linear_o_proj_residual")(x, w, res)
    torch.testing.assert_close(got, res + x @ w.T)


# ------------------------------------------------------------------ RoPE


def test_rope_reference_on_the_permuted_rows_is_upstreams_complex_rotation():
    """Upstream multiplies interleaved pairs by the complex table; the patch permutes the rope
    rows (evens, then odds), and the Definition's half rotation of those rows by the table's
    real and imaginary parts, repeated, is upstream's output in that order, as is the RoPE
    op's, at the preset's YaRN table. On tables whose halves differ (parity draws such) the
    reference still computes the op's rotation."""
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as upstream

    from tilegym.transformers.mla import rope_permutation

    gen = inv.generator(3)
    rotary = upstream.DeepseekV2RotaryEmbedding(inv.config(inv.preset(FAMILY)))
    b, s, h, r = 2, 7, 4, 64
    positions = torch.randint(0, 9000, (b, s), generator=gen)
    table = rotary(torch.ones(1), positions)
    assert table.is_complex() and table.shape == (b, s, r // 2)
    cos = torch.cat((table.real, table.real), dim=-1)
    sin = torch.cat((table.imag, table.imag), dim=-1)
    q = torch.randn(b, h, s, r, generator=gen)
    k = torch.randn(b, 1, s, r, generator=gen)
    want = upstream.apply_rotary_emb(q, k, table)
    perm = rope_permutation(r)
    inv.check_rope(FAMILY, q[..., perm], k[..., perm], cos, sin, [w[..., perm] for w in want])
    q, k = q.double(), k.double()
    cos2 = torch.randn(b, s, r, dtype=torch.float64, generator=gen)
    sin2 = torch.randn(b, s, r, dtype=torch.float64, generator=gen)
    inv.check_rope(FAMILY, q, k, cos2, sin2)


# ------------------------------------------------------------------ GEMMs


def test_gemm_references_are_the_upstream_modules_and_the_ops():
    """The lm_head is F.linear; the MLP Definitions (dense and shared experts) compose to
    DeepseekV2MLP plus the residual, each equal to its op on the packed [gate; up] weight."""
    linears = ("deepseek_v2_linear_lm_head", "deepseek_v2_linear_q_kv_a", "deepseek_v2_linear_kv_b")
    inv.check_gemms(FAMILY, linears, inv.generator(6), shared_experts_at_their_width=True)


# ------------------------------------------------------------------ the experts


def test_expert_reference_composes_to_the_upstream_experts():
    """The gate/up Definition's activations through each expert's down weight, weighted and
    summed, are transformers' DeepseekV2Experts output."""
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Experts

    gen = inv.generator(3)
    cfg = DeepseekV2Config(
        hidden_size=32, num_attention_heads=2, n_routed_experts=6, moe_intermediate_size=24
    )
    experts = DeepseekV2Experts(cfg)
    with torch.no_grad():
        experts.gate_up_proj.normal_(0, 0.2, generator=gen)
        experts.down_proj.normal_(0, 0.2, generator=gen)
    t, k = 7, 3
    x = torch.randn(t, 32, generator=gen)
    ids = torch.stack([torch.randperm(6, generator=gen)[:k] for _ in range(t)])
    w = torch.rand(t, k, generator=gen)
    gate_up = inv.reference(FAMILY, "deepseek_v2_experts_gate_up_silu")
    act = gate_up(x, ids.to(torch.int32), experts.gate_up_proj)
    down = experts.down_proj.detach()
    got = torch.einsum("tki,tkhi,tk->th", act, down[ids], w)
    with torch.no_grad():
        torch.testing.assert_close(got, experts(x, ids, w), rtol=1e-5, atol=1e-5)


def test_expert_stages_compose_to_the_upstream_experts_and_the_op():
    """The gate/up Definition's activations through the down/combine Definition (fp32 routing
    weights, the residual) are the residual plus transformers' DeepseekV2Experts output, the
    moe_experts op's reference and the op; in bf16 the combine rounds once, as the cited
    revision's fp32 sum does."""
    act, ids, w, down, res = inv.check_expert_stages(FAMILY)
    act16, res16 = act.bfloat16(), res.bfloat16()
    combine = inv.reference(FAMILY, "deepseek_v2_experts_down_combine")
    got16 = combine(act16, ids, w, down.bfloat16(), res16)
    rows = torch.einsum("tki,tkhi->tkh", act16.float(), down.bfloat16().float()[ids.long()])
    once = (res16.float() + (rows.bfloat16().float() * w[..., None]).sum(1)).bfloat16()
    assert got16.dtype == torch.bfloat16
    torch.testing.assert_close(got16, once, rtol=0, atol=0)


def test_parity_draws_prefill_shapes_with_the_new_tokens_among_the_keys():
    inv.check_prefill_shapes(FAMILY)


# ------------------------------------------------------------------ parity on the CPU


def _cpu_path(name: str):
    """What the patched model runs on the CPU for the Definition's op: the Lite's own routers
    here, the shared Definitions' in ``deepseek_inventory``."""
    from tilegym.ops import library
    from tilegym.ops.deepseek_route import dense_weights

    kw = inv.entry_kwargs(FAMILY, name)
    if name == "deepseek_v2_router":
        return lambda x, w: dense_weights(
            *library.router_greedy(x, w, kw["top_k"], kw["scaling"]), w.shape[0]
        )
    if name == "deepseek_v2_route":
        return lambda logits: library.moe_route(logits, kw["top_k"], kw["normalize"])
    return inv.cpu_path(FAMILY, name)


NEW_OPS = [
    "deepseek_v2_mla_absorb_query",
    "deepseek_v2_mla_latent_to_heads",
    "deepseek_v2_router_logits",
    "deepseek_v2_router",
    "deepseek_v2_latent_cache_update",
    "deepseek_v2_rotary_tables",
    "deepseek_v2_rope",
    "deepseek_v2_route",
]


@pytest.mark.parametrize("name", NEW_OPS)
def test_new_references_are_what_the_patched_model_computes_on_the_cpu(name):
    """The parity harness on the CPU (fresh random inputs at the Definition's shapes, fp64
    reference) with the model's CPU path in the Solution's place: the references run on CPU
    tensors and describe what the patched model computes."""
    inv.check_cpu_parity(FAMILY, name, _cpu_path(name), n_shapes=3)


def test_new_solutions_constants_are_the_lite_configs():
    cfg = inv.preset(FAMILY)
    assert inv.entry_kwargs(FAMILY, "deepseek_v2_router") == {
        "top_k": cfg["num_experts_per_tok"],
        "scaling": cfg["routed_scaling_factor"],
    }
    assert cfg["topk_method"] == "greedy"  # the fused router's method
    route = inv.entry_kwargs(FAMILY, "deepseek_v2_route")
    assert route == {"top_k": cfg["num_experts_per_tok"], "normalize": False}
    assert cfg["routed_scaling_factor"] == 1.0  # the route's weights are the routing
    inv.check_solution_constants(FAMILY)


def test_the_router_references_are_the_upstream_router():
    """The greedy Definition's reference, and the route's on the router's fp32 logits, against
    transformers' DeepseekV2TopkRouter (the routing as the experts see it) at the Lite
    widths."""
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    from tilegym.ops.deepseek_route import dense_weights

    cfg = inv.config(inv.preset(FAMILY))
    router = DeepseekV2TopkRouter(cfg)
    gen = inv.generator(4)
    with torch.no_grad():
        router.weight.normal_(0, 0.02, generator=gen)
        x = torch.randn(11, cfg.hidden_size, generator=gen)
        _, weights, ids = router(x)
        logits = torch.nn.functional.linear(x, router.weight)
    want = dense_weights(weights, ids, cfg.n_routed_experts)
    got = inv.reference(FAMILY, "deepseek_v2_router")(x, router.weight.detach())
    torch.testing.assert_close(got, want)
    route_weights, route_ids = inv.reference(FAMILY, "deepseek_v2_route")(logits)
    assert route_weights.dtype == torch.float32 and route_ids.dtype == torch.int32
    assert (route_weights[:, :-1] >= route_weights[:, 1:]).all()  # best first
    torch.testing.assert_close(dense_weights(route_weights, route_ids, cfg.n_routed_experts), want)


# ------------------------------------------------------------------ completeness

ROUTERS = {"router_greedy": "deepseek_v2_router", "router_logits": "deepseek_v2_router_logits"}


def _weights(model) -> dict[int, str]:
    """The Definition of each op that reads one of the model's own weights, by the weight (the
    router's weight: ``GATE``, its Definition by the op)."""
    return inv.model_weights(FAMILY, model, inv.GATE)


def _definitions_of(name: str, args, model, weights: dict[int, str]) -> list[str]:
    """The Definitions one op call computes: the routers by the router's weight they read, the
    route after upstream's fp32 linear by its fp32 logits, the first projection (the weight the
    patch built, with its permuted rope rows) by its shape; the rest as both families'."""
    c = model.config
    if name in ROUTERS:
        which, shape = weights.get(args[1].data_ptr()), tuple(args[1].shape)
        return [ROUTERS[name] if which == inv.GATE else f"unknown {name} {shape}"]
    if name == "moe_route":  # the route after upstream's fp32 linear: fp32 logits only
        fp32 = args[0].dtype == torch.float32
        return ["deepseek_v2_route" if fp32 else f"unknown moe_route of {args[0].dtype} logits"]
    heads, qk = c.num_attention_heads, c.qk_nope_head_dim + c.qk_rope_head_dim
    q_kv_a = (heads * qk + c.kv_lora_rank + c.qk_rope_head_dim, c.hidden_size)
    built = {q_kv_a: "deepseek_v2_linear_q_kv_a"}
    return inv.definitions_of(FAMILY, name, args, model, weights, built)


def _hits(d: dict, caches, dtype: torch.dtype = torch.float32) -> set[str]:
    """The Definitions hit by the patched model of config ``d`` (CPU, ``dtype``; in bf16 with
    an fp32 router weight) generating from a left-padded batch with each of ``caches``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = inv.config(d, d["num_hidden_layers"])
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and dtype != torch.float32:
            # transformers 5.24 keeps it fp32 itself (_keep_in_fp32_modules_strict); 5.17 not
            gate.weight.data = gate.weight.data.float()
    return inv.hits(model, caches, _weights, _definitions_of)


def test_every_op_the_patched_model_calls_has_a_definition_and_every_definition_is_called():
    """The tiny-deepseek_v2 preset (a dense layer, a sparse one; the Lite's greedy router; fp32):
    prefill and decode of a left-padded batch with the default cache and with the static one
    hit every Definition but the two routers' alternatives; its group-limited twin
    (DeepSeek-V2's router: the logits on their op, the routing after them in PyTorch) hits the
    router logits instead of the fused router, its bf16 twin with an fp32 router weight (the
    benchmark's model under transformers 5.24) the route after upstream's fp32 linear. Together:
    exactly the folder's Definitions."""
    every = inv.definition_names(FAMILY)
    routers = {"deepseek_v2_router", "deepseek_v2_router_logits", "deepseek_v2_route"}
    d = inv.preset("tiny-deepseek_v2")
    assert d["topk_method"] == "greedy"
    lite = _hits(d, ({}, {"cache_implementation": "static"}))
    assert lite == (every - routers) | {"deepseek_v2_router"}
    limited = dict(d, topk_method="group_limited_greedy", n_group=2, topk_group=1)
    grouped = _hits(limited, ({},))
    assert grouped <= every and grouped & routers == {"deepseek_v2_router_logits"}
    mixed = _hits(d, ({},), torch.bfloat16)
    assert mixed <= every and mixed & routers == {"deepseek_v2_route"}
    assert lite | grouped | mixed == every


def test_the_benchmarks_bf16_model_keeps_an_fp32_router_weight_under_5_24():
    """What the bf16 twin stands for: built as the benchmark builds it (``from_config`` with
    ``dtype``), transformers 5.24's sparse layer keeps its router weight in fp32
    (``_keep_in_fp32_modules_strict``; the patch then routes on ``deepseek_v2_route``), 5.17's
    casts it to bf16 (``deepseek_v2_router``)."""
    import transformers
    from packaging.version import Version
    from transformers import AutoModelForCausalLM
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2PreTrainedModel

    d = inv.preset("tiny-deepseek_v2")
    model = AutoModelForCausalLM.from_config(inv.config(d, 2), dtype=torch.bfloat16)
    got = model.model.layers[1].mlp.gate.weight.dtype
    strict = getattr(DeepseekV2PreTrainedModel, "_keep_in_fp32_modules_strict", None) or ()
    assert got == (torch.float32 if "gate.weight" in strict else torch.bfloat16)
    known = {(5, 17): torch.bfloat16, (5, 24): torch.float32}
    release = Version(transformers.__version__).release[:2]
    assert got == known.get(release, got)
