"""Qwen3.5's linear attention (``Qwen3_5GatedDeltaNet``) on the cuTile ops' glue, on the CPU.

On a CPU every op of ``tilegym.ops.library`` runs its PyTorch reference, so these tests check
the glue of ``tilegym.transformers.linear_attention``: the conv and its cache state, the q/k/v
split, the gated delta rule's prefill and decode with the recurrent state carried in the cache,
the gated norm, left padding; against the upstream model in fp32.
"""

from __future__ import annotations

import copy
import types

import pytest
import torch

qwen3_5 = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")

from tilegym.ops import library as lib  # noqa: E402
from tilegym.transformers.linear_attention import make_gated_delta_net_forward  # noqa: E402

SMALL = dict(
    vocab_size=256,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=4,  # three linear-attention layers, then one full attention
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    linear_conv_kernel_dim=4,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def _model():
    torch.manual_seed(0)
    config = qwen3_5.Qwen3_5TextConfig(**SMALL)
    model = qwen3_5.Qwen3_5ForCausalLM(config).eval()
    with torch.no_grad():  # non-trivial gates and norm weights (the init leaves them constant)
        for m in model.modules():
            if isinstance(m, qwen3_5.Qwen3_5GatedDeltaNet):
                m.dt_bias.normal_(0, 1)
                m.norm.weight.normal_(1, 0.2)
    return model


def _patch(model):
    forward = make_gated_delta_net_forward(qwen3_5.Qwen3_5GatedDeltaNet.forward)
    nets = [m for m in model.modules() if isinstance(m, qwen3_5.Qwen3_5GatedDeltaNet)]
    for m in nets:
        m.forward = types.MethodType(forward, m)
    return nets


def _batch(seq=70):
    """Three rows over more than a chunk (64): unpadded, left-padded by 5, by 66."""
    ids = torch.randint(3, 256, (3, seq), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    mask[2, :66] = 0
    return ids, mask


class _Calls:
    def __init__(self, monkeypatch):
        self.n: dict[str, int] = {}
        mod = "tilegym.transformers.linear_attention.lib"
        for name in ("causal_conv1d", "causal_conv1d_update", "gated_delta_chunk",
                     "gated_delta_recurrent", "rms_norm_gated"):  # fmt: skip
            real = getattr(lib, name)

            def counted(*a, _real=real, _name=name, **kw):
                self.n[_name] = self.n.get(_name, 0) + 1
                return _real(*a, **kw)

            monkeypatch.setattr(f"{mod}.{name}", counted)


def test_patched_logits_equal_upstream(monkeypatch):
    base = _model()
    patched = copy.deepcopy(base)
    assert len(_patch(patched)) == 3
    calls = _Calls(monkeypatch)
    ids, mask = _batch()
    with torch.no_grad():
        want = base(input_ids=ids, attention_mask=mask).logits
        got = patched(input_ids=ids, attention_mask=mask).logits
    valid = mask.bool()
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-4)
    assert calls.n == {"causal_conv1d": 3, "gated_delta_chunk": 3, "rms_norm_gated": 3}


def test_greedy_generation_carries_both_states_like_upstream(monkeypatch):
    """Prefill, then decode steps with the conv and recurrent states in the cache: same tokens
    and the same per-step logits as upstream."""
    base = _model()
    patched = copy.deepcopy(base)
    _patch(patched)
    calls = _Calls(monkeypatch)
    ids, mask = _batch()
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0,
              output_logits=True, return_dict_in_generate=True)  # fmt: skip
    with torch.no_grad():
        want = base.generate(input_ids=ids, attention_mask=mask, **kw)
        got = patched.generate(input_ids=ids, attention_mask=mask, **kw)
    assert torch.equal(got.sequences, want.sequences)
    for g, w in zip(got.logits, want.logits, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert calls.n["gated_delta_recurrent"] == 3 * 5 and calls.n["causal_conv1d_update"] == 15


def test_a_wrong_gate_is_caught(monkeypatch):
    """The comparison can fail: a decay off by a factor changes the logits."""
    base = _model()
    patched = copy.deepcopy(base)
    _patch(patched)
    real = lib.gated_delta_chunk

    def off(q, k, v, a, b, A_log, dt_bias, s=None):
        return real(q, k, v, a, b, A_log + 0.5, dt_bias, s)

    monkeypatch.setattr("tilegym.transformers.linear_attention.lib.gated_delta_chunk", off)
    ids, mask = _batch()
    with torch.no_grad():
        want = base(input_ids=ids, attention_mask=mask).logits
        got = patched(input_ids=ids, attention_mask=mask).logits
    assert (got - want).abs().max() > 1e-3


@pytest.mark.gpu
def test_on_the_gpu_the_kernels_follow_upstream_in_bf16():
    """The same glue on CUDA (the cuTile kernels) in bf16: prefill and decode logits no farther
    from upstream's fp32 ones than 1.5x upstream bf16's own error + 1e-3 (the judge's rule)."""
    dims = dict(linear_key_head_dim=64, linear_value_head_dim=64)
    torch.manual_seed(0)
    config = qwen3_5.Qwen3_5TextConfig(**{**SMALL, **dims})
    ref = qwen3_5.Qwen3_5ForCausalLM(config).eval().cuda()
    base = copy.deepcopy(ref).bfloat16()
    patched = copy.deepcopy(base)
    _patch(patched)
    ids, mask = (t.cuda() for t in _batch())
    valid = mask.bool()
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits[valid]
        bf16 = base(input_ids=ids, attention_mask=mask).logits[valid].float()
        got = patched(input_ids=ids, attention_mask=mask).logits[valid].float()
    err, err_bf16 = ((x - want).abs().max().item() for x in (got, bf16))
    assert err <= 1.5 * err_bf16 + 1e-3, (err, err_bf16)
    # decode: the patched model's per-step logits against fp32 teacher-forced on its tokens
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0,
              output_logits=True, return_dict_in_generate=True)  # fmt: skip
    with torch.no_grad():
        out = patched.generate(input_ids=ids, attention_mask=mask, **kw)
        seq = out.sequences
        full = torch.cat([mask, torch.ones_like(seq[:, ids.shape[1] :])], dim=1)
        at = slice(ids.shape[1] - 1, -1)
        want = ref(input_ids=seq, attention_mask=full).logits[:, at]
        bf16 = base(input_ids=seq, attention_mask=full).logits[:, at].float()
    got = torch.stack(out.logits, dim=1).float()
    err, err_bf16 = ((x - want).abs().max().item() for x in (got, bf16))
    assert err <= 1.5 * err_bf16 + 1e-3, (err, err_bf16)
