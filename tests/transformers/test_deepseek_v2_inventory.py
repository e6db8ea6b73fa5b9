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

import json
from pathlib import Path

import pytest
import torch
from cpu_generate import greedy, left_padded_batch
from op_calls import OpCalls

import tilegym.transformers
from tilegym.ops import mla, moe
from tilegym.ops.attention import reference_mask

ROOT = Path(tilegym.transformers.__file__).parent / "deepseek_v2"
DEFINITIONS = ROOT / "kernel_definitions"
SOLUTIONS = ROOT / "kernel_solutions"


def _json(folder: Path, name: str) -> dict:
    return json.loads((folder / f"{name}.json").read_text())


def _run(name: str):
    namespace: dict = {}
    exec(compile(_json(DEFINITIONS, name)["reference"], name, "exec"), namespace)  # noqa: S102
    return namespace["run"]


def _scale(name: str) -> float:
    return _kwargs(name)["scale"]


def _definition(name: str):
    from tilegym.kernel_inventory.models import Definition

    return Definition.from_dict(_json(DEFINITIONS, name))


def _kwargs(name: str) -> dict:
    return _json(SOLUTIONS, name)["spec"].get("entry_kwargs", {})


def _preset(key: str = "deepseek_v2") -> dict:
    from tilegym_hf_bench.presets import PRESETS, config_dict

    return config_dict(PRESETS[key])


def _config(d: dict, layers: int = 1):
    from transformers import AutoConfig

    return AutoConfig.for_model(**dict(d, num_hidden_layers=layers))


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------ shapes and constants


def _expected_axes(c: dict) -> dict[str, dict[str, int]]:
    h, heads, lat = c["hidden_size"], c["num_attention_heads"], c["kv_lora_rank"]
    r, n, v = c["qk_rope_head_dim"], c["qk_nope_head_dim"], c["v_head_dim"]
    inter, mi, e, k = (
        c["intermediate_size"],
        c["moe_intermediate_size"],
        c["n_routed_experts"],
        c["num_experts_per_tok"],
    )
    shared = mi * c["n_shared_experts"]
    return {
        "deepseek_v2_rms_norm": {"H": h},
        "deepseek_v2_kv_a_layernorm": {"H": lat},
        "deepseek_v2_linear_q_kv_a": {"K": h, "NQKV": heads * (n + r) + lat + r},
        "deepseek_v2_linear_kv_b": {"K": lat, "NKV": heads * (n + v)},
        "deepseek_v2_linear_o_proj_residual": {"Q": heads * v, "H": h},
        "deepseek_v2_linear_gate_up_silu": {"H": h, "I2": 2 * inter, "I": inter},
        "deepseek_v2_linear_down_residual": {"I": inter, "H": h},
        "deepseek_v2_shared_experts_gate_up_silu": {"H": h, "I2": 2 * shared, "I": shared},
        "deepseek_v2_shared_experts_down_residual": {"I": shared, "H": h},
        "deepseek_v2_linear_lm_head": {"H": h, "V": c["vocab_size"]},
        "deepseek_v2_rope": {"HQ": heads, "HK": 1, "D": r},
        "deepseek_v2_rotary_tables": {"RH": r // 2, "R": r},
        "deepseek_v2_mla_prefill": {"H": heads, "N": n, "R": r, "V": v, "ONE": 1},
        "deepseek_v2_mla_decode": {"H": heads, "L": lat, "R": r, "ONE": 1},
        "deepseek_v2_mla_absorb_query": {"H": heads, "N": n, "L": lat, "HNV": heads * (n + v)},
        "deepseek_v2_mla_latent_to_heads": {"H": heads, "L": lat, "V": v, "HNV": heads * (n + v)},
        "deepseek_v2_latent_cache_update": {"ONE": 1, "L": lat, "R": r},
        "deepseek_v2_router": {"H": h, "E": e},
        "deepseek_v2_router_logits": {"H": h, "E": e},
        "deepseek_v2_route": {"E": e, "K": k},
        "deepseek_v2_experts_gate_up_silu": {"K": k, "E": e, "H": h, "I2": 2 * mi, "I": mi},
        "deepseek_v2_experts_down_combine": {"K": k, "E": e, "H": h, "I": mi},
    }


#: the route after upstream's fp32 router linear: fp32 logits in, fp32 weights out
FP32_ONLY = {"deepseek_v2_route"}


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
        if name in FP32_ONLY:
            assert floats and not model_dtype, name
            continue
        assert model_dtype and set(model_dtype) == {cfg["torch_dtype"]}, name
    assert cfg["q_lora_rank"] is None  # q_proj, no q_a/q_b: the forms the Definitions describe
    assert not cfg["tie_word_embeddings"]  # the lm_head's own weight


def test_the_solutions_scale_is_the_lite_modules_scaling():
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention

    cfg = _config(_preset())
    scaling = DeepseekV2Attention(cfg, 0).scaling
    for name in ("deepseek_v2_mla_decode", "deepseek_v2_mla_prefill"):
        assert _scale(name) == scaling


def test_decode_reference_is_the_latent_attention():
    gen = _gen(0)
    b, h, t = 2, 16, 37
    ql, qp = torch.randn(b, h, 512, generator=gen) * 0.05, torch.randn(b, h, 64, generator=gen)
    ckv, kpe = torch.randn(b, 1, t, 512, generator=gen), torch.randn(b, 1, t, 64, generator=gen)
    scale = _scale("deepseek_v2_mla_decode")
    got = _run("deepseek_v2_mla_decode")(ql, qp, ckv, kpe)
    want = mla.reference_mla_decode(ql, qp, ckv, kpe, torch.ones(b, t, dtype=torch.bool), scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_prefill_reference_is_the_causal_mla_prefill():
    gen = _gen(1)
    b, h, s, t = 2, 16, 9, 13
    qn, qp = torch.randn(b, h, s, 128, generator=gen), torch.randn(b, h, s, 64, generator=gen)
    kn, kp = torch.randn(b, h, t, 128, generator=gen), torch.randn(b, 1, t, 64, generator=gen)
    v = torch.randn(b, h, t, 128, generator=gen)
    scale = _scale("deepseek_v2_mla_prefill")
    got = _run("deepseek_v2_mla_prefill")(qn, qp, kn, kp, v)
    want = mla.reference_mla_prefill(qn, qp, kn, kp, v, reference_mask(b, s, t), scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_norm_and_linear_references_are_the_upstream_modules():
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2RMSNorm

    gen = _gen(2)
    for name, h in (("deepseek_v2_rms_norm", 2048), ("deepseek_v2_kv_a_layernorm", 512)):
        norm = DeepseekV2RMSNorm(h, eps=1e-6)
        with torch.no_grad():
            norm.weight.normal_(1.0, 0.2, generator=gen)
        x = torch.randn(5, h, generator=gen)
        with torch.no_grad():
            torch.testing.assert_close(_run(name)(x, norm.weight.detach()), norm(x))
    x, res = torch.randn(5, 2048, generator=gen), torch.randn(5, 2048, generator=gen)
    w = torch.randn(2048, 2048, generator=gen) * 0.02
    got = _run("deepseek_v2_linear_o_proj_residual")(x, w, res)
    torch.testing.assert_close(got, res + x @ w.T)


# ------------------------------------------------------------------ RoPE


def test_rope_reference_on_the_permuted_rows_is_upstreams_complex_rotation():
    """Upstream multiplies interleaved pairs by the complex table; the patch permutes the rope
    rows (evens, then odds), and the Definition's half rotation of those rows by the table's
    real and imaginary parts, repeated, is upstream's output in that order, as is the RoPE
    op's, at the preset's YaRN table. On tables whose halves differ (parity draws such) the
    reference still computes the op's rotation."""
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as upstream

    from tilegym.ops.library import apply_rope
    from tilegym.transformers.mla import rope_permutation

    gen = _gen(3)
    rotary = upstream.DeepseekV2RotaryEmbedding(_config(_preset()))
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
    got = _run("deepseek_v2_rope")(q[..., perm], k[..., perm], cos, sin)
    ops = apply_rope(q[..., perm], k[..., perm], cos, sin)
    for g, o, w in zip(got, ops, want, strict=True):
        torch.testing.assert_close(g, w[..., perm])
        torch.testing.assert_close(o, w[..., perm])
    q, k = q.double(), k.double()
    cos2 = torch.randn(b, s, r, dtype=torch.float64, generator=gen)
    sin2 = torch.randn(b, s, r, dtype=torch.float64, generator=gen)
    got, ops = _run("deepseek_v2_rope")(q, k, cos2, sin2), apply_rope(q, k, cos2, sin2)
    for g, o in zip(got, ops, strict=True):
        torch.testing.assert_close(g, o, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ GEMMs


def test_gemm_references_are_the_upstream_modules_and_the_ops():
    """The lm_head is F.linear; the MLP Definitions (dense and shared experts) compose to
    DeepseekV2MLP plus the residual, each equal to its op on the packed [gate; up] weight."""
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2MLP

    from tilegym.ops import library

    gen = _gen(6)
    x, w = torch.randn(5, 48, generator=gen), torch.randn(40, 48, generator=gen)
    for name in (
        "deepseek_v2_linear_lm_head",
        "deepseek_v2_linear_q_kv_a",
        "deepseek_v2_linear_kv_b",
    ):
        torch.testing.assert_close(_run(name)(x, w), torch.nn.functional.linear(x, w))
        torch.testing.assert_close(_run(name)(x, w), library.linear(x, w))
    d = _preset("tiny-deepseek_v2")
    cfg = _config(dict(d, hidden_size=32, intermediate_size=24))
    widths = {
        "deepseek_v2_linear_gate_up_silu": ("deepseek_v2_linear_down_residual", None),
        "deepseek_v2_shared_experts_gate_up_silu": (
            "deepseek_v2_shared_experts_down_residual",
            d["moe_intermediate_size"] * d["n_shared_experts"],
        ),
    }
    for gate_up, (down, width) in widths.items():
        mlp = DeepseekV2MLP(cfg, intermediate_size=width)
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


# ------------------------------------------------------------------ the experts


def test_expert_reference_composes_to_the_upstream_experts():
    """The gate/up Definition's activations through each expert's down weight, weighted and
    summed, are transformers' DeepseekV2Experts output."""
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Experts

    gen = _gen(3)
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
    act = _run("deepseek_v2_experts_gate_up_silu")(x, ids.to(torch.int32), experts.gate_up_proj)
    down = experts.down_proj.detach()
    got = torch.einsum("tki,tkhi,tk->th", act, down[ids], w)
    with torch.no_grad():
        torch.testing.assert_close(got, experts(x, ids, w), rtol=1e-5, atol=1e-5)


def test_expert_stages_compose_to_the_upstream_experts_and_the_op():
    """The gate/up Definition's activations through the down/combine Definition (fp32 routing
    weights, the residual) are the residual plus transformers' DeepseekV2Experts output, the
    moe_experts op's reference and the op; in bf16 the combine rounds once, as the cited
    revision's fp32 sum does."""
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Experts

    from tilegym.ops import library

    gen = _gen(7)
    cfg = _config(dict(_preset("tiny-deepseek_v2"), hidden_size=32, n_routed_experts=6))
    experts = DeepseekV2Experts(cfg)
    with torch.no_grad():
        experts.gate_up_proj.normal_(0, 0.2, generator=gen)
        experts.down_proj.normal_(0, 0.2, generator=gen)
    t, k = 7, 3
    x, res = torch.randn(t, 32, generator=gen), torch.randn(t, 32, generator=gen)
    ids = torch.stack([torch.randperm(6, generator=gen)[:k] for _ in range(t)]).to(torch.int32)
    w = torch.rand(t, k, generator=gen)
    gu, down = experts.gate_up_proj.detach(), experts.down_proj.detach()
    act = _run("deepseek_v2_experts_gate_up_silu")(x, ids, gu)
    got = _run("deepseek_v2_experts_down_combine")(act, ids, w, down, res)
    with torch.no_grad():
        torch.testing.assert_close(got, res + experts(x, ids.long(), w), rtol=1e-5, atol=1e-5)
    want = moe.moe_experts_reference(x, ids, w, gu, down, res)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, library.moe_experts(x, ids, w, gu, down, res))
    act16, res16 = act.bfloat16(), res.bfloat16()
    got16 = _run("deepseek_v2_experts_down_combine")(act16, ids, w, down.bfloat16(), res16)
    rows = torch.einsum("tki,tkhi->tkh", act16.float(), down.bfloat16().float()[ids.long()])
    once = (res16.float() + (rows.bfloat16().float() * w[..., None]).sum(1)).bfloat16()
    assert got16.dtype == torch.bfloat16
    torch.testing.assert_close(got16, once, rtol=0, atol=0)


def test_parity_draws_prefill_shapes_with_the_new_tokens_among_the_keys():
    """The new tokens are the last ``S`` of ``T`` keys, so ``S <= T``; drawn without that
    constraint, parity asked the kernel for a negative query offset and it refused."""
    import random

    from tilegym.kernel_inventory.parity import sample_shapes

    shapes = sample_shapes(_definition("deepseek_v2_mla_prefill"), 32, random.Random(0))
    assert len(shapes) == 32
    assert all(b["S"] <= b["T"] for b in shapes)


# ------------------------------------------------------------------ parity on the CPU


def _split(kv_b_weight, heads, v_dim=128):
    return mla.split_kv_b_weight(kv_b_weight, heads, kv_b_weight.shape[0] // heads - v_dim, v_dim)


def _cpu_path(name: str):
    """What the patched model runs on the CPU for the Definition's op (the library's custom ops'
    CPU implementations), taking the Definition's tensors as the Solution's entry point does."""
    from tilegym.ops import library
    from tilegym.ops.deepseek_route import dense_weights

    kw = _kwargs(name)
    if name == "deepseek_v2_mla_absorb_query":
        return lambda q, w: library.mla_absorb_query(q, _split(w, q.shape[1])[0])
    if name == "deepseek_v2_mla_latent_to_heads":
        return lambda c, w: library.mla_latent_to_heads(c, _split(w, c.shape[1], kw["v_dim"])[1])
    if name == "deepseek_v2_router_logits":
        return library.router_logits
    if name == "deepseek_v2_router":
        return lambda x, w: dense_weights(
            *library.router_greedy(x, w, kw["top_k"], kw["scaling"]), w.shape[0]
        )
    if name == "deepseek_v2_rotary_tables":
        return lambda pos, inv: library.rotary_tables(
            pos, inv, kw["scaling"], getattr(torch, kw["dtype"])
        )
    if name == "deepseek_v2_rope":
        return library.apply_rope
    if name == "deepseek_v2_route":
        return lambda logits: library.moe_route(logits, kw["top_k"], kw["normalize"])

    def write(k, v, kc, vc):
        pos, length = torch.zeros(1, dtype=torch.int32), torch.zeros((), dtype=torch.int64)
        library.latent_cache_write_at(k, v, kc, vc, pos, length)

    return write


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
    from tilegym.kernel_inventory.parity import check_parity

    dps = _json(SOLUTIONS, name)["spec"]["destination_passing_style"]
    issues = check_parity(
        _definition(name), _cpu_path(name), device="cpu", destination_passing_style=dps, n_shapes=3
    )
    assert issues == []


def test_new_solutions_constants_are_the_lite_configs():
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2RotaryEmbedding

    cfg = _preset()
    assert _kwargs("deepseek_v2_router") == {
        "top_k": cfg["num_experts_per_tok"],
        "scaling": cfg["routed_scaling_factor"],
    }
    assert cfg["topk_method"] == "greedy"  # the fused router's method
    assert _kwargs("deepseek_v2_route") == {"top_k": cfg["num_experts_per_tok"], "normalize": False}
    assert cfg["routed_scaling_factor"] == 1.0  # the route's weights are the routing
    assert _kwargs("deepseek_v2_mla_latent_to_heads") == {"v_dim": cfg["v_head_dim"]}
    rotary = DeepseekV2RotaryEmbedding(_config(cfg))
    assert _kwargs("deepseek_v2_rotary_tables") == {
        "scaling": rotary.attention_scaling,
        "dtype": cfg["torch_dtype"],
    }
    tables = _definition("deepseek_v2_rotary_tables")
    assert tables.axes["RH"].value == rotary.inv_freq.shape[0] == cfg["qk_rope_head_dim"] // 2


def test_the_router_references_are_the_upstream_router():
    """The greedy Definition's reference, and the route's on the router's fp32 logits, against
    transformers' DeepseekV2TopkRouter (the routing as the experts see it) at the Lite
    widths."""
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    from tilegym.ops.deepseek_route import dense_weights

    cfg = _config(_preset())
    router = DeepseekV2TopkRouter(cfg)
    gen = _gen(4)
    with torch.no_grad():
        router.weight.normal_(0, 0.02, generator=gen)
        x = torch.randn(11, cfg.hidden_size, generator=gen)
        _, weights, ids = router(x)
        logits = torch.nn.functional.linear(x, router.weight)
    want = dense_weights(weights, ids, cfg.n_routed_experts)
    got = _run("deepseek_v2_router")(x, router.weight.detach())
    torch.testing.assert_close(got, want)
    route_weights, route_ids = _run("deepseek_v2_route")(logits)
    assert route_weights.dtype == torch.float32 and route_ids.dtype == torch.int32
    assert (route_weights[:, :-1] >= route_weights[:, 1:]).all()  # best first
    torch.testing.assert_close(dense_weights(route_weights, route_ids, cfg.n_routed_experts), want)


# ------------------------------------------------------------------ completeness

GATE = "the router's weight"
ROUTERS = {"router_greedy": "deepseek_v2_router", "router_logits": "deepseek_v2_router_logits"}


def _weights(model) -> dict[int, str]:
    """The Definition of each op that reads one of the model's own weights, by the weight (the
    router's weight: ``GATE``, its Definition by the op)."""
    out = {model.lm_head.weight.data_ptr(): "deepseek_v2_linear_lm_head"}
    out[model.model.norm.weight.data_ptr()] = "deepseek_v2_rms_norm"
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            out[norm.weight.data_ptr()] = "deepseek_v2_rms_norm"
        out[attn.kv_a_layernorm.weight.data_ptr()] = "deepseek_v2_kv_a_layernorm"
        out[attn.kv_b_proj.weight.data_ptr()] = "deepseek_v2_linear_kv_b"
        out[attn.o_proj.weight.data_ptr()] = "deepseek_v2_linear_o_proj_residual"
        if hasattr(mlp, "experts"):
            out[mlp.gate.weight.data_ptr()] = GATE
            down = mlp.shared_experts.down_proj.weight
            out[down.data_ptr()] = "deepseek_v2_shared_experts_down_residual"
        else:
            out[mlp.down_proj.weight.data_ptr()] = "deepseek_v2_linear_down_residual"
    return out


def _definitions_of(name: str, args, model, weights: dict[int, str]) -> list[str]:
    """The Definitions one op call computes: by the model weight it reads, else (the weights
    the patch built: the first projection with its permuted rope rows, the packed [gate; up])
    by the weight's shape."""
    c = model.config
    shape = tuple(args[1].shape) if len(args) > 1 and hasattr(args[1], "shape") else None
    which = weights.get(args[1].data_ptr()) if shape is not None else None
    if name in ("linear", "linear_residual", "rms_norm"):
        if which is None and name == "linear":
            heads, qk = c.num_attention_heads, c.qk_nope_head_dim + c.qk_rope_head_dim
            q_kv_a = (heads * qk + c.kv_lora_rank + c.qk_rope_head_dim, c.hidden_size)
            which = {q_kv_a: "deepseek_v2_linear_q_kv_a"}.get(shape)
        return [which if which not in (None, GATE) else f"unknown {name} {shape}"]
    if name in ROUTERS:
        return [ROUTERS[name] if which == GATE else f"unknown {name} {shape}"]
    if name == "fused_gate_up_silu":
        shared = c.moe_intermediate_size * c.n_shared_experts
        rows = {
            2 * c.intermediate_size: "deepseek_v2_linear_gate_up_silu",
            2 * shared: "deepseek_v2_shared_experts_gate_up_silu",
        }
        return [rows.get(shape[0], f"unknown gate/up {shape}")]
    if name == "moe_route":  # the route after upstream's fp32 linear: fp32 logits only
        fp32 = args[0].dtype == torch.float32
        return ["deepseek_v2_route" if fp32 else f"unknown moe_route of {args[0].dtype} logits"]
    named = {
        "apply_rope": ["deepseek_v2_rope"],
        "rotary_tables": ["deepseek_v2_rotary_tables"],
        "mla_prefill": ["deepseek_v2_mla_prefill"],
        "mla_decode": ["deepseek_v2_mla_decode"],
        "mla_absorb_query": ["deepseek_v2_mla_absorb_query"],
        "mla_latent_to_heads": ["deepseek_v2_mla_latent_to_heads"],
        "latent_cache_write_at": ["deepseek_v2_latent_cache_update"],
        "moe_experts": ["deepseek_v2_experts_gate_up_silu", "deepseek_v2_experts_down_combine"],
    }
    return named.get(name, [f"unknown op {name}"])


def _hits(d: dict, caches, dtype: torch.dtype = torch.float32) -> set[str]:
    """The Definitions hit by the patched model of config ``d`` (CPU, ``dtype``; in bf16 with
    an fp32 router weight) generating from a left-padded batch with each of ``caches``."""
    from transformers import AutoModelForCausalLM

    from tilegym.transformers import monkey_patch as mp

    torch.manual_seed(0)
    cfg = _config(d, d["num_hidden_layers"])
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and dtype != torch.float32:
            # transformers 5.24 keeps it fp32 itself (_keep_in_fp32_modules_strict); 5.17 not
            gate.weight.data = gate.weight.data.float()
    handle = mp.apply_tilegym_kernel(model)
    assert set(handle.applied) == {"rope", "rms_norm", "swiglu", "attn", "linear"}
    shared = cfg.moe_intermediate_size * cfg.n_shared_experts
    assert cfg.intermediate_size != shared  # the two gate/up GEMMs tell apart by their rows
    weights = _weights(model)
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    hit: set[str] = set()
    for cache in caches:
        recorder = OpCalls()
        with recorder:
            greedy(model, ids, mask, new_tokens=4, **cache)
        for name, args in recorder.calls:
            hit.update(_definitions_of(name, args, model, weights))
    return hit


def test_every_op_the_patched_model_calls_has_a_definition_and_every_definition_is_called():
    """The tiny-deepseek_v2 preset (a dense layer, a sparse one; the Lite's greedy router; fp32):
    prefill and decode of a left-padded batch with the default cache and with the static one
    hit every Definition but the two routers' alternatives; its group-limited twin
    (DeepSeek-V2's router: the logits on their op, the routing after them in PyTorch) hits the
    router logits instead of the fused router, its bf16 twin with an fp32 router weight (the
    benchmark's model under transformers 5.24) the route after upstream's fp32 linear. Together:
    exactly the folder's Definitions."""
    every = {p.stem for p in DEFINITIONS.glob("*.json")}
    routers = {"deepseek_v2_router", "deepseek_v2_router_logits", "deepseek_v2_route"}
    d = _preset("tiny-deepseek_v2")
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

    d = _preset("tiny-deepseek_v2")
    model = AutoModelForCausalLM.from_config(_config(d, 2), dtype=torch.bfloat16)
    got = model.model.layers[1].mlp.gate.weight.dtype
    strict = getattr(DeepseekV2PreTrainedModel, "_keep_in_fp32_modules_strict", None) or ()
    assert got == (torch.float32 if "gate.weight" in strict else torch.bfloat16)
    known = {(5, 17): torch.bfloat16, (5, 24): torch.float32}
    release = Version(transformers.__version__).release[:2]
    assert got == known.get(release, got)
