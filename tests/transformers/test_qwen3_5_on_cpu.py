"""Qwen3.5's text model (``qwen3_5_text``: gated delta net layers, three per gated full-attention
layer) patched against upstream on the CPU (fp32), where every cuTile op runs its PyTorch
reference: logits, greedy tokens of left-padded batches whose prompts cross a 64-token chunk,
the conv and recurrent states carried from prefill into decode (per-step logits), the M-RoPE
tables, and transformers' static cache (states updated in place), eager and compiled."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from cpu_generate import greedy, left_padded_batch, patched_pair

qwen3_5 = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")

from tilegym.ops import library as lib  # noqa: E402
from tilegym.transformers import monkey_patch as mp  # noqa: E402
from tilegym.transformers.qwen3_5.modeling_qwen3_5 import FAMILY  # noqa: E402

# one layer_types period (three linear-attention layers, then a full one) twice; head 64 with
# partial rotary 0.25 rotates 16 dims; the gated delta heads at a width the kernels take (64)
EXTRA = dict(
    num_hidden_layers=8,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
)


def _pair(**flags):
    """(upstream, patched twin, handle) with non-trivial norm weights and gates (the init
    leaves the zero-centred norms at 0, dt_bias at 1 and the gated norm at 1)."""
    base, _, _ = patched_pair("qwen3_5_text", **EXTRA)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in base.modules():
            if isinstance(m, qwen3_5.Qwen3_5GatedDeltaNet):
                m.dt_bias.copy_(torch.randn(m.dt_bias.shape, generator=gen))
                m.norm.weight.copy_(1 + 0.2 * torch.randn(m.norm.weight.shape, generator=gen))
            elif isinstance(m, qwen3_5.Qwen3_5RMSNorm):
                m.weight.copy_(0.3 * torch.randn(m.weight.shape, generator=gen))
    patched = copy.deepcopy(base)
    return base, patched, mp.apply_tilegym_kernel(patched, **flags)


def _long_batch(seq: int = 70):
    """Three rows over more than a chunk (64): unpadded, left-padded by 5 and by 66."""
    ids = torch.randint(3, 256, (3, seq), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    mask[2, :66] = 0
    return ids, mask


class _Calls:
    """Counts the library ops the patched forwards call (as the glue modules import them)."""

    GLUE = {
        "tilegym.transformers.linear_attention.lib": (
            "causal_conv1d", "causal_conv1d_update", "gated_delta_chunk",
            "gated_delta_recurrent", "rms_norm_gated",
        ),
        "tilegym.transformers.decoder": ("apply_rope", "qk_norm_rope"),
    }  # fmt: skip

    def __init__(self, monkeypatch):
        self.n: dict[str, int] = {}
        for where, names in self.GLUE.items():
            for name in names:
                real = getattr(lib, name)

                def counted(*a, _real=real, _name=name, **kw):
                    self.n[_name] = self.n.get(_name, 0) + 1
                    return _real(*a, **kw)

                monkeypatch.setattr(f"{where}.{name}", counted)


def test_the_family_patches_every_part():
    base, patched, handle = _pair()
    assert handle.applied == list(mp.FLAGS), handle.not_applied
    kinds = [layer.block_type for layer in base.model.layers]
    assert kinds == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + [
        "full_attention"
    ]
    for layer in patched.model.layers:
        mixer = layer.linear_attn if layer.block_type == "linear_attention" else layer.self_attn
        assert "forward" in vars(mixer) and "forward" in vars(layer)
    assert patched.config._attn_implementation == "tilegym"


@pytest.mark.parametrize("batch", ["short", "long"])
def test_the_patched_model_computes_the_upstream_one(monkeypatch, batch):
    base, patched, _ = _pair()
    ids, mask = left_padded_batch((0, 4, 9), seed=1) if batch == "short" else _long_batch()
    calls = _Calls(monkeypatch)
    with torch.no_grad():
        want = base(input_ids=ids, attention_mask=mask).logits
        got = patched(input_ids=ids, attention_mask=mask).logits
    valid = mask.bool()
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-4)
    # six gated delta layers, two gated attention layers with partial rotary (no fused
    # norm + RoPE kernel: it rotates whole heads)
    assert calls.n["gated_delta_chunk"] == 6 and calls.n["causal_conv1d"] == 6
    assert calls.n["rms_norm_gated"] == 6
    assert calls.n["apply_rope"] == 2 and "qk_norm_rope" not in calls.n
    assert torch.equal(greedy(patched, ids, mask), greedy(base, ids, mask))


def test_prefill_states_carry_into_decode_like_upstream(monkeypatch):
    """Prefill over 70 tokens, then decode steps from the conv and recurrent states in the
    cache: the same tokens and the same per-step logits as upstream."""
    base, patched, _ = _pair()
    ids, mask = _long_batch()
    calls = _Calls(monkeypatch)
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0,
              output_logits=True, return_dict_in_generate=True)  # fmt: skip
    with torch.no_grad():
        want = base.generate(input_ids=ids, attention_mask=mask, **kw)
        got = patched.generate(input_ids=ids, attention_mask=mask, **kw)
    assert torch.equal(got.sequences, want.sequences)
    for g, w in zip(got.logits, want.logits, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert calls.n["gated_delta_recurrent"] == 6 * 5 and calls.n["causal_conv1d_update"] == 30


def test_text_positions_give_plain_partial_rope_and_distinct_rows_still_match(monkeypatch):
    """For text the three M-RoPE rows are equal and the table is plain RoPE over the first
    quarter of the head (half-split, not interleaved); with distinct T/H/W rows the patched
    layers still rotate by whatever table upstream hands them."""
    base, patched, _ = _pair()
    rotary = base.model.rotary_emb
    pos = torch.arange(11)[None].expand(2, -1)
    x = torch.zeros(1, dtype=torch.float32)
    cos, sin = rotary(x, pos[None].expand(3, -1, -1))
    rot = int(base.config.head_dim * 0.25)
    inv = 1.0 / (base.config.rope_parameters["rope_theta"] ** (torch.arange(0, rot, 2) / rot))
    freqs = pos[..., None].float() * inv
    torch.testing.assert_close(cos, torch.cat((freqs, freqs), -1).cos())
    torch.testing.assert_close(sin, torch.cat((freqs, freqs), -1).sin())
    ids, mask = left_padded_batch((0, 0), seed=2)
    t = torch.arange(11)  # text row, then T, H, W rows that differ beyond an offset
    rows = torch.stack([t, t, 2 * t, t % 3])[:, None].expand(-1, 2, -1)
    with torch.no_grad():
        want = base(input_ids=ids, attention_mask=mask, position_ids=rows).logits
        got = patched(input_ids=ids, attention_mask=mask, position_ids=rows).logits
        plain = base(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (want - plain).abs().max() > 1e-3  # the distinct rows do change the rotation


def test_a_wrong_norm_form_is_caught():
    """The comparison can fail: the same layers with plain (not zero-centred) RMSNorms."""
    base, _, _ = _pair()
    wrong = copy.deepcopy(base)
    mp.apply_family(wrong, dataclasses.replace(FAMILY, norm_unit_offset=False))
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    with torch.no_grad():
        diff = (
            wrong(input_ids=ids, attention_mask=mask).logits
            - base(input_ids=ids, attention_mask=mask).logits
        )
    assert diff.abs().max() > 1e-2


def test_the_static_cache_keeps_its_state_tensors_and_updates_them_in_place():
    """transformers' own StaticCache: after the prefill, a decode step writes the conv and
    recurrent states into the same tensors (a compiled step's CUDA graph holds them), and
    the tokens equal upstream's with a dynamic cache."""
    from transformers import StaticCache

    base, patched, _ = _pair()
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    cache = StaticCache(config=patched.config, max_cache_len=32)
    with torch.no_grad():
        out = patched(input_ids=ids, attention_mask=mask, use_cache=True, **{_kw(patched): cache})
        layer = cache.layers[0]
        conv, rec = layer.conv_states[0], layer.recurrent_states[0]
        before = (conv.clone(), rec.clone())
        step = out.logits[:, -1:].argmax(-1)
        mask2 = torch.cat([mask, torch.ones_like(step)], dim=1)
        position = torch.full((1,), ids.shape[1])
        patched(input_ids=step, attention_mask=mask2, use_cache=True, cache_position=position,
                **{_kw(patched): cache})  # fmt: skip
    assert layer.conv_states[0] is conv and layer.recurrent_states[0] is rec
    assert not torch.equal(conv, before[0]) and not torch.equal(rec, before[1])
    got = greedy(patched, ids, mask, new_tokens=6, cache_implementation="static")
    assert torch.equal(got, greedy(base, ids, mask, new_tokens=6))


def _kw(model) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def test_the_decode_step_compiles_with_a_static_cache():
    """Greedy tokens with transformers' static cache and the whole decode step compiled
    (fullgraph, aot_eager): upstream's eager tokens."""
    from transformers import CompileConfig

    base, patched, _ = _pair()
    torch._dynamo.reset()
    ids, mask = _long_batch()
    cfg = CompileConfig(fullgraph=True, backend="aot_eager")
    cfg._compile_all_devices = True
    got = greedy(patched, ids, mask, cache_implementation="static", compile_config=cfg)
    assert torch.equal(got, greedy(base, ids, mask))


@pytest.mark.parametrize("off", ["attn", "rms_norm", "linear"])
def test_each_flag_off_still_computes_the_upstream_model(monkeypatch, off):
    """A flag off leaves its part upstream: with ``attn`` off the gated delta nets are
    upstream's (no linear-attention op runs) and still get the patched layer's residual."""
    base, patched, handle = _pair(**{off: False})
    assert off in handle.not_applied
    calls = _Calls(monkeypatch)
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    with torch.no_grad():
        want = base(input_ids=ids, attention_mask=mask).logits
        got = patched(input_ids=ids, attention_mask=mask).logits
    valid = mask.bool()
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-4)
    assert ("gated_delta_chunk" in calls.n) == (off != "attn")
