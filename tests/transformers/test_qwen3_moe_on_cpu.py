"""The Qwen3-MoE family on the CPU (fp32): the sparse block's patched forward against upstream.

On a CPU every cuTile op runs its PyTorch implementation (``tilegym.ops.library``), so these
tests check the glue of the MoE block (``tilegym.transformers.moe_block``): which op each flag
routes the router and the experts through, the residual it folds in, experts that receive no
token, dense layers beside sparse ones, batches with left padding, undo, class-level patching,
the family probe's description, and the compiled static-cache decode step (``fullgraph``).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import cpu_generate
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, CompileConfig

import tilegym.transformers.moe_block as moe_block
from tilegym.kernel_inventory.parity import load_reference
from tilegym.transformers import monkey_patch as mp
from tilegym.transformers.family_probe import describe_structure, verify

UPSTREAM = "transformers.models.qwen3_moe.modeling_qwen3_moe"
SMALL = dict(
    cpu_generate.SMALL,
    moe_intermediate_size=48,
    num_experts=32,
    num_experts_per_tok=4,
    norm_topk_prob=True,
    num_hidden_layers=2,
)
FLAG_SETS = {
    "all": {},
    "no-linear": dict(linear=False),  # upstream router and experts, cuTile norms/RoPE/attention
    "no-swiglu": dict(swiglu=False),  # cuTile router, upstream experts
    "linear-only": dict(rope=False, rms_norm=False, swiglu=False, attn=False),
    "none": dict(rope=False, rms_norm=False, swiglu=False, attn=False, linear=False),
}


def _model(**extra):
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen3_moe", **{**SMALL, **extra})
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # a router N(0, 0.02) over 128 wide inputs is nearly uniform: sharpen
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0, 0.5)
    return model


def _batch(seq=11):
    """Three rows: unpadded, left-padded by 4, and a single real token."""
    ids = torch.randint(1, SMALL["vocab_size"], (3, seq))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    mask[2, : seq - 1] = 0
    return ids, mask


def _logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


class _Counter:
    """Counts calls of the MoE ops the patched block makes (they stay the real ops)."""

    def __init__(self, monkeypatch):
        self.calls = {"moe_route": 0, "moe_experts": 0}
        for name in self.calls:
            real = getattr(moe_block, name)

            def counted(*args, _real=real, _name=name, **kwargs):
                self.calls[_name] += 1
                return _real(*args, **kwargs)

            monkeypatch.setattr(moe_block, name, counted)


def _sparse_blocks(model):
    return [m for m in model.modules() if type(m).__name__ == "Qwen3MoeSparseMoeBlock"]


@pytest.mark.parametrize("flags", list(FLAG_SETS), ids=list(FLAG_SETS))
def test_the_patched_model_computes_upstream_logits_with_every_flag_set(flags, monkeypatch):
    counter = _Counter(monkeypatch)
    base = _model()
    patched = copy.deepcopy(base)
    ids, mask = _batch()
    want = _logits(base, ids, mask)
    handle = mp.apply_tilegym_kernel(patched, **FLAG_SETS[flags])
    try:
        wanted = [f for f in mp.FLAGS if FLAG_SETS[flags].get(f, True)]
        assert handle.applied == wanted, handle.not_applied
        blocks = _sparse_blocks(patched)
        patched_blocks = sum("forward" in vars(b) for b in blocks)
        assert patched_blocks == (len(blocks) if flags != "none" else 0)
        got = _logits(patched, ids, mask)
        valid = mask.bool()
        torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-4)
        linear = "linear" in handle.applied
        fused = linear and "swiglu" in handle.applied
        assert counter.calls["moe_route"] == (len(blocks) if linear else 0)
        assert counter.calls["moe_experts"] == (len(blocks) if fused else 0)
    finally:
        handle.undo()


def test_undo_restores_the_upstream_model_bit_for_bit():
    model = _model()
    ids, mask = _batch()
    before = _logits(model, ids, mask)
    handle = mp.apply_tilegym_kernel(model)
    assert all("forward" in vars(b) for b in _sparse_blocks(model))
    _logits(model, ids, mask)
    handle.undo()
    assert torch.equal(_logits(model, ids, mask), before)
    assert not any("forward" in vars(m) for m in model.modules())


def test_greedy_generation_of_a_left_padded_batch_matches_upstream():
    base = _model()
    patched = copy.deepcopy(base)
    mp.apply_tilegym_kernel(patched)
    ids, mask = _batch()
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = base.generate(input_ids=ids, attention_mask=mask, **kw)
        got = patched.generate(input_ids=ids, attention_mask=mask, **kw)
    assert torch.equal(got, want)


@pytest.mark.parametrize("tokens", [1, 2, 7])
def test_experts_that_receive_no_token_contribute_nothing(tokens):
    """A few tokens over 32 experts (4 each) leave most experts without a token; the patched
    block with its residual equals the upstream block plus that residual."""
    model = _model()
    block = _sparse_blocks(model)[0]
    patched = copy.deepcopy(model)
    handle = mp.apply_tilegym_kernel(patched)
    pblock = _sparse_blocks(patched)[0]
    x = torch.randn(1, tokens, SMALL["hidden_size"])
    residual = torch.randn_like(x)
    with torch.no_grad():
        _, _, ids = block.gate(x.reshape(-1, SMALL["hidden_size"]))
        assert len(ids.unique()) < SMALL["num_experts"]
        want = residual + block(x)
        got = pblock(x, residual=residual)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pblock(x), block(x), rtol=1e-5, atol=1e-5)
    handle.undo()


def test_every_token_on_the_same_experts():
    """A router that sends every token to the same 4 experts (28 of 32 get none)."""
    model = _model()
    block = _sparse_blocks(model)[0]
    with torch.no_grad():
        block.gate.weight.zero_()
        block.gate.weight[3:7] = 0.05 * torch.arange(1, 5).float()[:, None]
    patched = copy.deepcopy(model)
    handle = mp.apply_tilegym_kernel(patched)
    x = torch.rand(2, 5, SMALL["hidden_size"]) + 0.1  # positive: the order of experts 3..6 holds
    with torch.no_grad():
        _, _, ids = block.gate(x.reshape(-1, SMALL["hidden_size"]))
        assert set(ids.unique().tolist()) == {3, 4, 5, 6}
        got = _sparse_blocks(patched)[0](x, residual=x)
        torch.testing.assert_close(got, x + block(x), rtol=1e-5, atol=1e-5)
    handle.undo()


@pytest.mark.parametrize(
    "extra",
    [dict(mlp_only_layers=[0]), dict(decoder_sparse_step=2, num_hidden_layers=3)],
    ids=["mlp_only_layers", "decoder_sparse_step"],
)
def test_dense_layers_beside_sparse_ones(extra):
    base = _model(**extra)
    kinds = [type(layer.mlp).__name__ for layer in base.model.layers]
    assert "Qwen3MoeMLP" in kinds and "Qwen3MoeSparseMoeBlock" in kinds
    patched = copy.deepcopy(base)
    handle = mp.apply_tilegym_kernel(patched)
    assert handle.applied == list(mp.FLAGS), handle.not_applied
    assert all("forward" in vars(layer.mlp) for layer in patched.model.layers)
    ids, mask = _batch()
    valid = mask.bool()
    got, want = _logits(patched, ids, mask), _logits(base, ids, mask)
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-4)
    handle.undo()


def test_norm_topk_prob_off_keeps_the_softmax_weights():
    base = _model(norm_topk_prob=False)
    patched = copy.deepcopy(base)
    handle = mp.apply_tilegym_kernel(patched)
    ids, mask = _batch()
    valid = mask.bool()
    got, want = _logits(patched, ids, mask), _logits(base, ids, mask)
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-4)
    handle.undo()


def test_class_level_patch_and_undo_restore_the_upstream_block_forward():
    up = __import__(UPSTREAM, fromlist=["_"])
    original = up.Qwen3MoeSparseMoeBlock.__dict__["forward"]
    base = _model()
    handle = mp.apply_tilegym_kernel_to_qwen3_moe(attn=False)
    try:
        assert up.Qwen3MoeSparseMoeBlock.__dict__["forward"] is not original
        patched = _model()  # built after the class patch, same seed: same weights
        ids, mask = _batch()
        valid = mask.bool()
        got, want = _logits(patched, ids, mask), _logits(base, ids, mask)
        torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-4)
    finally:
        handle.undo()
    assert up.Qwen3MoeSparseMoeBlock.__dict__["forward"] is original


def test_the_family_is_dispatched_and_described_as_registered():
    assert "qwen3_moe" in mp.supported_model_types()
    desc = mp.FAMILIES["qwen3_moe"].description()
    assert desc.moe_block == "SparseMoeBlock" and desc.qk_norm
    model = _model(mlp_only_layers=[1])
    probe = describe_structure(model)
    assert probe.family == desc
    assert verify(model, probe.family, lambda m: mp.apply_family(m, probe.family)) <= 1e-4


def test_a_block_with_a_shared_expert_is_described_with_it():
    """Qwen2-MoE's block adds a sigmoid-gated shared expert, which the MoE forward runs since
    Qwen3-Next (``Family.moe_shared_expert``; the numbers: test_family_probe.py)."""
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "qwen2_moe",
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        num_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
    )
    model = AutoModelForCausalLM.from_config(config).eval()
    family = describe_structure(model).family
    assert family.moe_shared_expert and family.moe_block == "SparseMoeBlock"


@pytest.mark.slow
def test_static_cache_decode_step_compiles_once_with_fullgraph():
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    base = _model()
    patched = copy.deepcopy(base)
    handle = mp.apply_tilegym_kernel(patched)
    assert handle.applied == list(mp.FLAGS), handle.not_applied
    ids, mask = _batch()
    kw = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = base.generate(input_ids=ids, attention_mask=mask, **kw)
    cfg = CompileConfig(fullgraph=True, backend="inductor", mode="default")
    cfg._compile_all_devices = True  # transformers compiles the decode step on GPUs only

    def static():
        with torch.no_grad():
            return patched.generate(
                input_ids=ids,
                attention_mask=mask,
                cache_implementation="static",
                compile_config=cfg,
                **kw,
            )

    counters.clear()
    got, code = run_and_get_code(static)
    assert torch.equal(got, want)
    assert counters["stats"]["unique_graphs"] == 1
    code = "\n".join(code)
    assert "torch.ops.tilegym.moe_route" in code
    assert "torch.ops.tilegym.moe_experts" in code
    with torch.compiler.set_stance("fail_on_recompile"):
        assert torch.equal(static(), want)
    handle.undo()


def _reference(name: str):
    folder = Path(mp.__file__).parent / "qwen3_moe" / "kernel_definitions"
    doc = json.loads((folder / f"{name}.json").read_text())
    return load_reference(SimpleNamespace(name=doc["name"], reference=doc["reference"]))


def test_the_moe_definitions_references_compose_to_the_upstream_block():
    """Router linear -> routing -> gate/up + SiLU -> down + combine, each Definition's
    reference run as the inventory runs it, is the upstream sparse block plus the residual
    (fp32, transformers 5's packed expert weights; 8 experts per token as in Qwen3-30B-A3B)."""
    model = _model(num_experts_per_tok=8)
    block = _sparse_blocks(model)[0]
    x = torch.randn(13, SMALL["hidden_size"])
    residual = torch.randn_like(x)
    with torch.no_grad():
        logits = _reference("qwen3_moe_linear_router")(x, block.gate.weight)
        weights, ids = _reference("qwen3_moe_router")(logits)
        _, want_weights, want_ids = block.gate(x)
        assert ids.dtype == torch.int32 and torch.equal(ids.long(), want_ids)
        torch.testing.assert_close(weights, want_weights)
        act = _reference("qwen3_moe_experts_gate_up_silu")(x, ids, block.experts.gate_up_proj)
        down = _reference("qwen3_moe_experts_down_combine")
        got = down(act, ids, weights, block.experts.down_proj, residual)
        want = residual + block(x[None])[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_router_reference_orders_equal_probabilities_by_expert():
    """Equal logits (as bf16 rounding makes them) come out in expert order, the order the
    router kernel's first-index argmax gives."""
    logits = torch.zeros(2, 128)
    logits[0, [90, 7, 33]] = 1.0
    weights, ids = _reference("qwen3_moe_router")(logits)
    assert ids[0, :3].tolist() == [7, 33, 90] and ids[0, 3:].tolist() == [0, 1, 2, 3, 4]
    assert ids[1].tolist() == list(range(8))
    torch.testing.assert_close(weights.sum(-1), torch.ones(2))
