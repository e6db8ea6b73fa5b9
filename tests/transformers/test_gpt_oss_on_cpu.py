"""gpt-oss patched against upstream on the CPU (fp32): attention sinks, alternating sliding and
full layers, biased q/k/v/o, half-width YaRN tables, the biased top-k router and the clamped
experts. Logits and greedy tokens of a left-padded batch, sinks and clamps that bind, a static
cache past the window (ring buffers) eager and compiled, patched and upstream; a tiny MXFP4
checkpoint loaded dequantized."""

from __future__ import annotations

import json

import pytest
import torch
from cpu_generate import (
    SMALL,
    assert_compiles_like_upstream,
    assert_same_as_upstream,
    greedy,
    left_padded_batch,
    patched_pair,
)

from tilegym.transformers import monkey_patch as mp

# layers alternate: 0 slides over 4 tokens (the prompts hold 11), 1 is full; 8 experts, top-2
GPT_OSS = dict(
    num_hidden_layers=2,
    num_local_experts=8,
    num_experts_per_tok=2,
    sliding_window=4,
    intermediate_size=96,
)


def _binding(model) -> None:
    """Sinks and biases large enough to matter, and expert biases that push the gate past the
    clamp's limit and |up| past it (random init leaves both far inside)."""
    torch.manual_seed(5)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(layer.self_attn, proj).bias.normal_(0.0, 0.5)
            layer.mlp.router.bias.normal_(0.0, 1.0)
            experts = layer.mlp.experts
            experts.gate_up_proj_bias.normal_(0.0, 8.0)
            experts.down_proj_bias.normal_(0.0, 0.5)


def _pair(**extra):
    base, patched, handle = patched_pair("gpt_oss", **{**GPT_OSS, **extra})
    _binding(base)
    patched.load_state_dict(base.state_dict())
    handle.undo()  # repacked weights were built from the old values: patch again
    return base, patched, mp.apply_tilegym_kernel(patched)


def test_the_patched_model_computes_the_upstream_one():
    base, patched, handle = _pair()
    assert handle.applied == list(mp.FLAGS), handle.not_applied
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    assert_same_as_upstream(base, patched, ids, mask)


def test_the_layers_alternate_and_the_clamps_bind():
    base, _, _ = _pair()
    assert [layer.self_attn.sliding_window for layer in base.model.layers] == [4, None]
    experts = base.model.layers[0].mlp.experts
    x = torch.randn(16, base.config.hidden_size)
    with torch.no_grad():
        gu = x @ experts.gate_up_proj[0] + experts.gate_up_proj_bias[0]
    assert (gu[:, ::2] > experts.limit).any() and (gu[:, 1::2].abs() > experts.limit).any()


def test_every_part_runs_patched():
    """GptOssMLP is patched as the sparse block (no dense MLP forward), attention runs the
    "tilegym" function, and the sinks reach it: changing them changes the patched output."""
    base, patched, _ = _pair()
    layer = patched.model.layers[0]
    assert all("forward" in vars(m) for m in (layer, layer.self_attn, layer.mlp))
    assert patched.config._attn_implementation == "tilegym"
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    with torch.no_grad():
        before = patched(input_ids=ids, attention_mask=mask).logits
        for m in (base, patched):
            for lay in m.model.layers:
                lay.self_attn.sinks.add_(3.0)
        after = patched(input_ids=ids, attention_mask=mask).logits
        want = base(input_ids=ids, attention_mask=mask).logits
    valid = mask.bool()
    assert (after[valid] - before[valid]).abs().max() > 1e-3
    torch.testing.assert_close(after[valid], want[valid], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("flag", ["linear", "swiglu", "attn", "rope"])
def test_each_flag_off_still_computes_upstream(flag):
    base, patched, handle = _pair()
    handle.undo()
    handle = mp.apply_tilegym_kernel(patched, **{flag: False})
    assert flag not in handle.applied
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    assert_same_as_upstream(base, patched, ids, mask)


def test_a_static_cache_past_the_window_generates_the_upstream_tokens():
    """Prompts of 11 tokens and 8 new ones over a window of 4: the sliding layer's static
    cache is a ring buffer, decoded by the device position with the sinks."""
    base, patched, _ = _pair()
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    got = greedy(patched, ids, mask, new_tokens=8, cache_implementation="static")
    assert torch.equal(got, greedy(base, ids, mask, new_tokens=8))


def test_undo_restores_upstream_forwards_and_frees_the_expert_copies():
    _, patched, handle = _pair()
    experts = patched.model.layers[0].mlp.experts
    assert hasattr(experts, "_tilegym_expert_rows")
    handle.undo()
    assert not hasattr(experts, "_tilegym_expert_rows")
    assert "forward" not in vars(patched.model.layers[0].mlp)


def test_the_upstream_model_compiles_with_a_static_cache_past_the_window():
    """The PyTorch side of the benchmark's static mode: upstream gpt-oss (its default experts
    implementation, eager attention with sinks) with a static cache, the whole decode step
    compiled in one graph, generates its eager tokens; 8 new tokens after 11 over a window of 4
    wrap the sliding layer's ring buffer. Decides whether static mode can run for gpt_oss
    (on a GPU Inductor also captures CUDA graphs, which a CPU cannot check)."""
    from transformers import CompileConfig

    base, _, _ = _pair()
    torch._dynamo.reset()
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    cfg = CompileConfig(fullgraph=True, backend="aot_eager")
    cfg._compile_all_devices = True
    got = greedy(base, ids, mask, new_tokens=8, cache_implementation="static", compile_config=cfg)
    assert torch.equal(got, greedy(base, ids, mask, new_tokens=8))


@pytest.mark.slow
def test_the_patched_model_compiles_with_a_static_cache():
    base, patched, _ = _pair()
    assert_compiles_like_upstream(base, patched)


def test_a_model_with_a_foreign_mlp_is_refused_and_left_unpatched():
    """transformers' MXFP4 kernels swap GptOssMLP for their own module, which the patched layer
    forward (it passes the residual) cannot call: the patch refuses and undoes itself."""

    class ForeignMLP(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, hidden_states):
            return self.inner(hidden_states)

    base, patched, handle = _pair()
    handle.undo()
    patched.model.layers[1].mlp = ForeignMLP(patched.model.layers[1].mlp)
    with pytest.raises(TypeError, match="ForeignMLP in GptOssDecoderLayer"):
        mp.apply_tilegym_kernel(patched)
    assert "forward" not in vars(patched.model.layers[0])
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    with torch.no_grad():
        patched(input_ids=ids, attention_mask=mask)  # upstream forwards still run


#: MXFP4's 16 FP4 (e2m1) values by their 4-bit code, as the format defines them
FP4 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def _mxfp4_values(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """A checkpoint's ``*_blocks`` ``[E, R, G, 16]`` (two FP4 codes a byte, low nibble first)
    and ``*_scales`` ``[E, R, G]`` (E8M0, bias 127) as the ``[E, G * 32, R]`` parameter."""
    e, r, g, b = blocks.shape
    codes = torch.stack((blocks & 15, blocks >> 4), dim=-1).long()
    vals = FP4[codes].reshape(e, r, g, 2 * b) * torch.exp2(scales.float() - 127)[..., None]
    return vals.reshape(e, r, g * 2 * b).transpose(1, 2)


def test_an_mxfp4_checkpoint_loaded_dequantized_is_patched_and_computes_upstream(tmp_path):
    """The published checkpoints store the experts as MXFP4 blocks and scales. A tiny one in
    that format, loaded with ``Mxfp4Config(dequantize=True)`` (what transformers also falls
    back to without its Triton MXFP4 kernels), keeps ``GptOssMLP`` with plain ``GptOssExperts``
    parameters holding the decoded values; the patch applies every flag and computes the
    upstream model (fp32)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoModelForCausalLM, Mxfp4Config

    torch.manual_seed(0)
    config = AutoConfig.for_model("gpt_oss", **{**SMALL, **GPT_OSS})
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    gen = torch.Generator().manual_seed(1)
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        e, cols, rows = tensors.pop(name).shape  # [E, in, out]: blocks run along "in"
        shape = (e, rows, cols // 32)
        tensors[f"{name}_blocks"] = torch.randint(0, 256, (*shape, 16), generator=gen).byte()
        tensors[f"{name}_scales"] = torch.randint(121, 128, shape, generator=gen).byte()
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "mxfp4"}
    (tmp_path / "config.json").write_text(json.dumps(raw))

    quant = Mxfp4Config(dequantize=True)
    load = AutoModelForCausalLM.from_pretrained
    base = load(tmp_path, quantization_config=quant).eval().float()  # 5.17 decodes to bf16
    for i, layer in enumerate(base.model.layers):
        assert type(layer.mlp).__name__ == "GptOssMLP"
        for proj in ("gate_up_proj", "down_proj"):
            key = f"model.layers.{i}.mlp.experts.{proj}"
            want = _mxfp4_values(tensors[f"{key}_blocks"], tensors[f"{key}_scales"])
            assert torch.equal(getattr(layer.mlp.experts, proj).detach(), want)
    patched = load(tmp_path, quantization_config=quant).eval().float()
    handle = mp.apply_tilegym_kernel(patched)
    assert handle.applied == list(mp.FLAGS), handle.not_applied
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    assert_same_as_upstream(base, patched, ids, mask)
