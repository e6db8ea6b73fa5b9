"""qwen3_next's Definitions compute what the patched model computes on the CPU, and the inventory
is complete.

Each reference against the ``tilegym.ops.library`` functions the glue calls (their PyTorch
implementations on the CPU), through the inventory's own parity check (fresh random bf16 inputs
at sampled shapes, the reference in float64, inputs the ops update in place declared
``mutates:``); a few const axes too large for the CPU (the vocabulary, the 512 experts) are
shrunk there, the references being shape-generic. The two expert Definitions compose to the
experts op's reference. The const axes are the ``qwen3_next`` benchmark preset's shapes, so the
same parity on a GPU (``test_kernel_inventory.py``) runs the Solutions at the real shapes. And
every ``tilegym`` op the patched model calls (prefill and decode, default and static cache) has
its Definition and every Definition is called."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cpu_generate import greedy, left_padded_batch, small_family_pair
from linear_attention_glue import MIXER_GLUE
from op_calls import OpCalls

import tilegym.transformers
from tilegym.kernel_inventory.models import Definition
from tilegym.kernel_inventory.parity import check_parity, load_reference
from tilegym.ops import library as lib

pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

ROOT = Path(tilegym.transformers.__file__).parent / "qwen3_next"
FOLDER = ROOT / "kernel_definitions"
SCALE = 256**-0.5


def _data(stem: str) -> dict:
    return json.loads((FOLDER / f"qwen3_next_{stem}.json").read_text())


def _definition(stem: str, **const: int) -> Definition:
    """The Definition, with the const axes ``const`` set to other (CPU-sized) values."""
    data = _data(stem)
    for axis, value in const.items():
        assert data["axes"][axis]["type"] == "const"
        data["axes"][axis] = {**data["axes"][axis], "value": value}
    return Definition.from_dict(data)


def _kv_write(key_new, value_new, key_cache, value_cache):
    position, length = torch.zeros(1, dtype=torch.int32), torch.zeros((), dtype=torch.int64)
    lib.kv_cache_write_at(key_new, value_new, key_cache, value_cache, position, length)


def _unit_norm(x, w):
    return lib.rms_norm(x, w, 1e-6, True)


def _linear(x, w):
    return lib.linear(x, w, None)


def _experts_gate_up(hidden, ids, gate_up_weight):
    """Each (token, slot) pair through its expert's fused gate/up GEMM op."""
    act = hidden.new_zeros((*ids.shape, gate_up_weight.shape[1] // 2))
    for e in ids.unique().tolist():
        tok, slot = torch.where(ids == e)
        act[tok, slot] = lib.fused_gate_up_silu(hidden[tok], gate_up_weight[e])
    return act


def _experts_down(act, ids, weights, down_weight, residual):
    """Each pair through its expert's down GEMM op, weighted and summed in fp32."""
    out = residual.float()
    for e in ids.unique().tolist():
        tok, slot = torch.where(ids == e)
        y = lib.linear(act[tok, slot], down_weight[e], None)
        out.index_add_(0, tok, y.float() * weights[tok, slot, None].float())
    return out.to(residual.dtype)


#: Definition stem -> what the CPU glue runs for it
GLUE = {
    **MIXER_GLUE,
    "rms_norm": _unit_norm,
    "qk_norm": _unit_norm,
    "rope_tables": lambda pos, inv: lib.rotary_tables(pos, inv, 1.0, torch.bfloat16),
    "rope_partial": lib.apply_rope,
    "linear_qkv": _linear,
    "attention_prefill": lambda q, k, v: lib.prefill_attention(q, k, v, scale=SCALE),
    "attention_decode": lambda q, k, v: lib.decode_attention(q, k, v, scale=SCALE),
    "kv_cache_update": _kv_write,
    "linear_o_proj_residual": lib.linear_residual,
    "linear_in_proj": _linear,
    "linear_out_proj_residual": lib.linear_residual,
    "linear_router": _linear,
    "experts_gate_up_silu": _experts_gate_up,
    "experts_down_combine": _experts_down,
    "linear_shared_expert_gate": _linear,
    "linear_shared_gate_up_silu": lib.fused_gate_up_silu,
    "linear_shared_down_proj": _linear,
    "linear_lm_head": _linear,
    "shared_expert_gate_add": lib.sigmoid_gate_add,
}

#: Definitions checked by their own tests below: the route's ids are exact, and on bf16 logits
#: drawn at random equal probabilities are common, whose order ``torch.topk`` (the op's CPU
#: reference) leaves open
OWN_TESTS = {"router"}

#: const axes shrunk for the CPU parity (a 151936 x 2048 bf16 weight upcast to float64, the
#: 512 experts' weights): the references read every size from their inputs
CPU_SIZES = {
    "linear_lm_head": {"V": 4096},
    "experts_gate_up_silu": {"E": 16},
    "experts_down_combine": {"E": 16},
}


def test_every_definition_has_its_glue_here_and_a_solution():
    stems = sorted(p.stem.removeprefix("qwen3_next_") for p in FOLDER.glob("*.json"))
    assert stems == sorted([*GLUE, *OWN_TESTS])
    solutions = sorted(p.stem for p in (ROOT / "kernel_solutions").glob("*.json"))
    assert solutions == [f"qwen3_next_{s}" for s in stems]


@pytest.mark.parametrize("stem", sorted(GLUE))
def test_the_reference_computes_what_the_cpu_glue_computes(stem):
    issues = check_parity(
        _definition(stem, **CPU_SIZES.get(stem, {})),
        GLUE[stem],
        device="cpu",
        destination_passing_style=stem == "kv_cache_update",
        n_shapes=2,
    )
    assert not issues, [i.message for i in issues]


def _route(logits):
    return load_reference(_definition("router"))(logits)


def test_the_route_reference_is_the_route_op_on_distinct_logits():
    """Top 10 of 512, renormalized, best first, on logits without ties (distinct in bf16)."""
    gen = torch.Generator().manual_seed(0)
    values = torch.arange(512, dtype=torch.float64) / 64 - 4  # 512 distinct bf16 values
    logits = torch.stack([values[torch.randperm(512, generator=gen)] for _ in range(33)])
    logits = logits.to(torch.bfloat16)
    assert all(len(set(row.tolist())) == 512 for row in logits)
    weights, ids = _route(logits.double())
    want_weights, want_ids = lib.moe_route(logits, 10, True)
    assert ids.dtype == torch.int32 and torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights.double(), rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(weights.sum(-1), torch.ones(33, dtype=torch.float64))


def test_the_route_reference_orders_equal_probabilities_by_expert():
    """Equal logits: the same weights as the op, the tied experts in index order (where the
    cuTile kernel puts them; the CPU op's ``topk`` may not)."""
    logits = torch.full((2, 512), -1.0, dtype=torch.bfloat16)
    logits[0, [7, 300, 3, 511, 40]] = 2.0  # five tied winners
    logits[0, [9, 10, 400, 2, 100]] = 1.0  # and the next five, tied too
    logits[1, 500:510] = torch.arange(10, dtype=torch.bfloat16)  # no ties
    weights, ids = _route(logits.double())
    assert ids[0].tolist() == [3, 7, 40, 300, 511, 2, 9, 10, 100, 400]
    assert ids[1].tolist() == list(range(509, 499, -1))
    want_weights, want_ids = lib.moe_route(logits, 10, True)
    torch.testing.assert_close(weights, want_weights.double(), rtol=1e-2, atol=1e-3)
    assert [set(r.tolist()) for r in ids] == [set(r.tolist()) for r in want_ids]


def test_the_expert_references_compose_to_the_experts_op():
    """Gate/up then down + combine is ``moe_experts`` (the routed experts with the residual;
    its CPU reference computes in fp32)."""
    gen = torch.Generator().manual_seed(0)
    t, k, e, h, inter = 9, 10, 16, 64, 32
    x = torch.randn(t, h, generator=gen, dtype=torch.float64)
    residual = torch.randn(t, h, generator=gen, dtype=torch.float64)
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)]).to(torch.int32)
    weights = torch.softmax(torch.randn(t, k, generator=gen, dtype=torch.float64), -1)
    gate_up = torch.randn(e, 2 * inter, h, generator=gen, dtype=torch.float64) * h**-0.5
    down = torch.randn(e, h, inter, generator=gen, dtype=torch.float64) * inter**-0.5
    act = load_reference(_definition("experts_gate_up_silu"))(x, ids, gate_up)
    got = load_reference(_definition("experts_down_combine"))(act, ids, weights, down, residual)
    want = lib.moe_experts(x, ids, weights, gate_up, down, residual)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_check_catches_key_heads_tiled_instead_of_interleaved():
    """Each key head serves two consecutive value heads (upstream's repeat_interleave): a
    reference that tiled the heads instead pairs most value heads with the wrong key head."""
    data = _data("gated_delta_chunk")
    wrong = data["reference"].replace(
        ".repeat_interleave(groups, dim=2)", ".repeat(1, 1, groups, 1)"
    )
    assert wrong.count(".repeat(1, 1, groups, 1)") == 2
    definition = Definition.from_dict({**data, "reference": wrong})
    issues = check_parity(definition, GLUE["gated_delta_chunk"], device="cpu", n_shapes=1)
    assert any("'out'" in i.message for i in issues)


def test_const_axes_are_the_benchmark_presets_shapes():
    from tilegym_hf_bench.presets import PRESETS, config_dict

    c = config_dict(PRESETS["qwen3_next"])
    h, d, hq, hkv = (
        c["hidden_size"],
        c["head_dim"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
    )
    hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    e, k, inter = c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
    shared = c["shared_expert_intermediate_size"]
    rot = int(d * c["rope_parameters"]["partial_rotary_factor"])
    conv = 2 * hk * dk + hv * dv
    attention = {"HQ": hq, "HKV": hkv, "D": d}
    gdn = {"HK": hk, "HV": hv, "DK": dk, "DV": dv}
    want = {
        "rms_norm": {"H": h},
        "qk_norm": {"H": d},
        "rope_tables": {"RH": rot // 2, "R": rot},
        "rope_partial": {"HQ": hq, "HK": hkv, "D": d, "R": rot},
        "linear_qkv": {"H": h, "N": (2 * hq + 2 * hkv) * d},
        "attn_output_gate": {"H": hq, "D": d, "D2": 2 * d, "Q": hq * d},
        "attention_prefill": attention,
        "attention_decode": {**attention, "Q": 1},
        "kv_cache_update": {"HKV": hkv, "D": d},
        "linear_o_proj_residual": {"Q": hq * d, "H": h},
        "linear_in_proj": {"H": h, "N": conv + hv * dv + 2 * hv},
        "causal_conv1d": {"C": conv, "K": c["linear_conv_kernel_dim"]},
        "causal_conv1d_update": {"C": conv, "K": c["linear_conv_kernel_dim"], "Q": 1},
        "gated_delta_chunk": gdn,
        "gated_delta_recurrent": {**gdn, "Q": 1},
        "rms_norm_gated": {"N": dv},
        "linear_out_proj_residual": {"Q": hv * dv, "H": h},
        "linear_router": {"H": h, "E": e},
        "router": {"E": e, "K": k},
        "experts_gate_up_silu": {"K": k, "E": e, "H": h, "I2": 2 * inter, "I": inter},
        "experts_down_combine": {"K": k, "E": e, "H": h, "I": inter},
        "linear_shared_expert_gate": {"H": h, "N": 1},
        "linear_shared_gate_up_silu": {"H": h, "I2": 2 * shared, "I": shared},
        "linear_shared_down_proj": {"I": shared, "H": h},
        "linear_lm_head": {"H": h, "V": c["vocab_size"]},
        "shared_expert_gate_add": {"H": h, "one": 1},
    }
    assert sorted(want) == sorted([*GLUE, *OWN_TESTS])
    for stem, axes in want.items():
        got = {a: v["value"] for a, v in _data(stem)["axes"].items() if v["type"] == "const"}
        assert got == axes, stem
    router = json.loads((ROOT / "kernel_solutions" / "qwen3_next_router.json").read_text())
    assert router["spec"]["entry_kwargs"] == {"top_k": k, "normalize": c["norm_topk_prob"]}


def _gemms(model, fused) -> dict[int, str]:
    """The Definition of each GEMM weight the patched model's ops read, by its address."""
    from tilegym.transformers.family import GATE_UP, QKV
    from tilegym.transformers.linear_attention import _in_proj_weight

    found = {model.lm_head.weight.data_ptr(): "linear_lm_head"}
    for layer in model.model.layers:
        mlp = layer.mlp
        found[mlp.gate.weight.data_ptr()] = "linear_router"
        found[mlp.shared_expert_gate.weight.data_ptr()] = "linear_shared_expert_gate"
        found[fused.get(mlp.shared_expert, GATE_UP)[0].data_ptr()] = "linear_shared_gate_up_silu"
        found[mlp.shared_expert.down_proj.weight.data_ptr()] = "linear_shared_down_proj"
        if hasattr(layer, "self_attn"):
            found[fused.get(layer.self_attn, QKV)[0].data_ptr()] = "linear_qkv"
            found[layer.self_attn.o_proj.weight.data_ptr()] = "linear_o_proj_residual"
        else:
            net = layer.linear_attn
            found[_in_proj_weight(net, fused).data_ptr()] = "linear_in_proj"
            found[net.out_proj.weight.data_ptr()] = "linear_out_proj_residual"
    return found


NAMED = {
    "rotary_tables": ["rope_tables"],
    "apply_rope": ["rope_partial"],
    "sigmoid_gate": ["attn_output_gate"],
    "sigmoid_gate_add": ["shared_expert_gate_add"],
    "prefill_attention": ["attention_prefill"],
    "decode_attention": ["attention_decode"],
    "kv_cache_write_at": ["kv_cache_update"],
    "causal_conv1d": ["causal_conv1d"],
    "causal_conv1d_update": ["causal_conv1d_update"],
    "gated_delta_chunk": ["gated_delta_chunk"],
    "gated_delta_recurrent": ["gated_delta_recurrent"],
    "rms_norm_gated": ["rms_norm_gated"],
    "moe_route": ["router"],
    "moe_experts": ["experts_gate_up_silu", "experts_down_combine"],
}


def _definitions_of(name, args, model, gemms) -> list[str]:
    """The Definitions one op call computes (which GEMM: by its weight; which norm: by its
    width)."""
    if name in ("linear", "linear_residual", "fused_gate_up_silu"):
        which = gemms.get(args[1].data_ptr())
        return [which] if which else [f"unknown {name} {tuple(args[1].shape)}"]
    if name == "rms_norm":
        return ["qk_norm" if args[1].shape[0] == model.config.head_dim else "rms_norm"]
    return NAMED.get(name, [f"unknown op {name}"])


def test_every_op_the_patched_model_calls_has_a_definition_and_every_definition_is_called():
    """Prefill and decode of a left-padded batch with the default cache and with the static
    one, on the family's small config made tiny: the Definitions hit are exactly the folder's."""
    _, patched, handle = small_family_pair("qwen3_next")
    assert handle.applied == ["rope", "rms_norm", "swiglu", "attn", "linear"]
    gemms = _gemms(patched, handle.repacked)
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    hit = set()
    for cache in ({}, {"cache_implementation": "static"}):
        recorder = OpCalls()
        with recorder:
            greedy(patched, ids, mask, new_tokens=3, **cache)
        for name, args in recorder.calls:
            hit.update(_definitions_of(name, args, patched, gemms))
    definitions = {*GLUE, *OWN_TESTS}
    assert hit == definitions
