"""DeepSeek-V2's MLA Definitions compute what the ops' references (and so the patched model)
compute: the decode reference (absorbed form over the latent cache) against
``reference_mla_decode`` and the prefill reference against ``reference_mla_prefill``, on small
random inputs at the Definitions' widths and the Solutions' scale; the Solutions' scale is the
module's ``scaling`` at DeepSeek-V2-Lite's config (YaRN mscale included). The absorbed decode's
products, the router (logits; greedy routing), the latent cache write and the RoPE tables: the
parity harness on the CPU with the patched model's CPU path in the Solution's place, the
router's reference against transformers' router, the Solutions' constants against the Lite
config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import tilegym.transformers
from tilegym.ops import mla
from tilegym.ops.attention import reference_mask

ROOT = Path(tilegym.transformers.__file__).parent / "deepseek_v2"


def _run(name: str):
    namespace: dict = {}
    definition = json.loads((ROOT / "kernel_definitions" / f"{name}.json").read_text())
    exec(compile(definition["reference"], name, "exec"), namespace)  # noqa: S102
    return namespace["run"]


def _scale(name: str) -> float:
    solution = json.loads((ROOT / "kernel_solutions" / f"{name}.json").read_text())
    return solution["spec"]["entry_kwargs"]["scale"]


def test_the_solutions_scale_is_the_lite_modules_scaling():
    from tilegym_hf_bench.presets import PRESETS, config_dict
    from transformers import AutoConfig
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention

    cfg = AutoConfig.for_model(**dict(config_dict(PRESETS["deepseek_v2"]), num_hidden_layers=1))
    scaling = DeepseekV2Attention(cfg, 0).scaling
    for name in ("deepseek_v2_mla_decode", "deepseek_v2_mla_prefill"):
        assert _scale(name) == scaling


def test_decode_reference_is_the_latent_attention():
    gen = torch.Generator().manual_seed(0)
    b, h, t = 2, 16, 37
    ql, qp = torch.randn(b, h, 512, generator=gen) * 0.05, torch.randn(b, h, 64, generator=gen)
    ckv, kpe = torch.randn(b, 1, t, 512, generator=gen), torch.randn(b, 1, t, 64, generator=gen)
    scale = _scale("deepseek_v2_mla_decode")
    got = _run("deepseek_v2_mla_decode")(ql, qp, ckv, kpe)
    want = mla.reference_mla_decode(ql, qp, ckv, kpe, torch.ones(b, t, dtype=torch.bool), scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_prefill_reference_is_the_causal_mla_prefill():
    gen = torch.Generator().manual_seed(1)
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

    gen = torch.Generator().manual_seed(2)
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


def test_expert_reference_composes_to_the_upstream_experts():
    """The gate/up Definition's activations through each expert's down weight, weighted and
    summed, are transformers' DeepseekV2Experts output."""
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Experts

    gen = torch.Generator().manual_seed(3)
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


def test_parity_draws_prefill_shapes_with_the_new_tokens_among_the_keys():
    """The new tokens are the last ``S`` of ``T`` keys, so ``S <= T``; drawn without that
    constraint, parity asked the kernel for a negative query offset and it refused."""
    import random

    from tilegym.kernel_inventory.models import Definition
    from tilegym.kernel_inventory.parity import sample_shapes

    path = ROOT / "kernel_definitions" / "deepseek_v2_mla_prefill.json"
    definition = Definition.from_dict(json.loads(path.read_text()))
    shapes = sample_shapes(definition, 32, random.Random(0))
    assert len(shapes) == 32
    assert all(b["S"] <= b["T"] for b in shapes)


def _definition(name: str):
    from tilegym.kernel_inventory.models import Definition

    path = ROOT / "kernel_definitions" / f"{name}.json"
    return Definition.from_dict(json.loads(path.read_text()))


def _kwargs(name: str) -> dict:
    solution = json.loads((ROOT / "kernel_solutions" / f"{name}.json").read_text())
    return solution["spec"].get("entry_kwargs", {})


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
]


@pytest.mark.parametrize("name", NEW_OPS)
def test_new_references_are_what_the_patched_model_computes_on_the_cpu(name):
    """The parity harness on the CPU (fresh random inputs at the Definition's shapes, fp64
    reference) with the model's CPU path in the Solution's place: the references run on CPU
    tensors and describe what the patched model computes."""
    from tilegym.kernel_inventory.parity import check_parity

    solution = json.loads((ROOT / "kernel_solutions" / f"{name}.json").read_text())
    dps = solution["spec"]["destination_passing_style"]
    issues = check_parity(
        _definition(name), _cpu_path(name), device="cpu", destination_passing_style=dps, n_shapes=3
    )
    assert issues == []


def test_new_solutions_constants_are_the_lite_configs():
    from tilegym_hf_bench.presets import PRESETS, config_dict

    cfg = config_dict(PRESETS["deepseek_v2"])
    assert _kwargs("deepseek_v2_router") == {
        "top_k": cfg["num_experts_per_tok"],
        "scaling": cfg["routed_scaling_factor"],
    }
    assert cfg["topk_method"] == "greedy"  # the fused router's method
    assert _kwargs("deepseek_v2_mla_latent_to_heads") == {"v_dim": cfg["v_head_dim"]}
    heads, nope, v = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    absorb = _definition("deepseek_v2_mla_absorb_query")
    assert absorb.axes["HNV"].value == heads * (nope + v)
    assert absorb.axes["L"].value == cfg["kv_lora_rank"]
    assert _definition("deepseek_v2_router").axes["E"].value == cfg["n_routed_experts"]
    from transformers import AutoConfig
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2RotaryEmbedding

    rotary = DeepseekV2RotaryEmbedding(AutoConfig.for_model(**dict(cfg, num_hidden_layers=1)))
    assert _kwargs("deepseek_v2_rotary_tables") == {
        "scaling": rotary.attention_scaling,
        "dtype": cfg["torch_dtype"],
    }
    tables = _definition("deepseek_v2_rotary_tables")
    assert tables.axes["RH"].value == rotary.inv_freq.shape[0] == cfg["qk_rope_head_dim"] // 2


def test_the_router_reference_is_the_upstream_router():
    """The greedy Definition's reference against transformers' DeepseekV2TopkRouter (the
    routing as the experts see it) at the Lite widths."""
    from tilegym_hf_bench.presets import PRESETS, config_dict
    from transformers import AutoConfig
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    from tilegym.ops.deepseek_route import dense_weights

    cfg = AutoConfig.for_model(**dict(config_dict(PRESETS["deepseek_v2"]), num_hidden_layers=1))
    router = DeepseekV2TopkRouter(cfg)
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        router.weight.normal_(0, 0.02, generator=gen)
        x = torch.randn(11, cfg.hidden_size, generator=gen)
        _, weights, ids = router(x)
    got = _run("deepseek_v2_router")(x, router.weight.detach())
    torch.testing.assert_close(got, dense_weights(weights, ids, cfg.n_routed_experts))
