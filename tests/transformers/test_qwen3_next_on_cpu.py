"""Qwen3-Next's text model patched against upstream on the CPU (fp32): its gated delta nets
(q, k, v, z and b, a packed per key head in two projections, relaid once for the shared
glue), gated full attention, and sparse MoE blocks with a sigmoid-gated shared expert; logits,
greedy tokens of a left-padded batch, each flag off, the state carried into decode, and a
compiled static-cache decode step."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from cpu_generate import SMALL, assert_same_as_upstream, greedy, left_padded_batch

qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from tilegym.transformers import monkey_patch as mp  # noqa: E402
from tilegym.transformers.linear_attention import _relaid_in_proj  # noqa: E402
from tilegym.transformers.qwen3_next.modeling_qwen3_next import FAMILY  # noqa: E402

# one layer_types period; two value heads per key head (the packed layout's interleave shows)
EXTRA = dict(
    num_hidden_layers=4,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=32,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=96,
    norm_topk_prob=True,
)


def _pair(description=FAMILY, **flags):
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen3_next", **{**SMALL, **EXTRA})
    base = AutoModelForCausalLM.from_config(config).eval()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # gates, norms and routers off their constant init
        for name, p in base.named_parameters():
            if name.endswith(("dt_bias", "norm.weight", "gate.weight")):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    patched = copy.deepcopy(base)
    return base, patched, mp.apply_family(patched, description, **flags)


def test_the_registered_family_patches_every_flag():
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen3_next", **{**SMALL, **EXTRA})
    model = AutoModelForCausalLM.from_config(config).eval()
    assert mp.apply_tilegym_kernel(model).applied == list(mp.FLAGS)


@pytest.mark.parametrize("off", [None, "linear", "swiglu", "attn"])
def test_the_patched_model_computes_the_upstream_one(off):
    base, patched, handle = _pair(**({off: False} if off else {}))
    assert off is None or off in handle.not_applied
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    assert_same_as_upstream(base, patched, ids, mask)


def test_the_relaid_projection_is_upstreams_split():
    """The relaid rows give q, k, v, z, b, a exactly as fix_query_key_value_ordering splits the
    packed outputs."""
    base, _, _ = _pair()
    net = base.model.layers[0].linear_attn
    x = torch.randn(2, 5, net.hidden_size)
    (w,) = _relaid_in_proj(net)
    got = torch.nn.functional.linear(x, w)
    q, k, v, z, b, a = net.fix_query_key_value_ordering(net.in_proj_qkvz(x), net.in_proj_ba(x))
    flat = [t.reshape(2, 5, -1) for t in (q, k, v, z, b, a)]
    torch.testing.assert_close(got, torch.cat(flat, dim=-1), rtol=1e-5, atol=1e-5)


def test_the_shared_expert_counts():
    """The comparison can fail: the same blocks without their shared expert."""
    base, wrong, _ = _pair(dataclasses.replace(FAMILY, moe_shared_expert=False))
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    with torch.no_grad():
        a = wrong(input_ids=ids, attention_mask=mask).logits
        b = base(input_ids=ids, attention_mask=mask).logits
    assert (a - b).abs().max() > 1e-2


def test_prefill_states_carry_into_decode_and_a_static_step_compiles():
    from transformers import CompileConfig

    base, patched, _ = _pair()
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    kw = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, pad_token_id=0,
              output_logits=True, return_dict_in_generate=True)  # fmt: skip
    with torch.no_grad():
        want = base.generate(input_ids=ids, attention_mask=mask, **kw)
        got = patched.generate(input_ids=ids, attention_mask=mask, **kw)
    assert torch.equal(got.sequences, want.sequences)
    for g, w in zip(got.logits, want.logits, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()
    cfg = CompileConfig(fullgraph=True, backend="aot_eager")
    cfg._compile_all_devices = True
    static = greedy(patched, ids, mask, cache_implementation="static", compile_config=cfg)
    assert torch.equal(static, greedy(base, ids, mask))


@pytest.mark.parametrize("off", [None, "swiglu"])
def test_the_sigmoid_gates_run_on_their_ops_with_swiglu(off):
    """One ``sigmoid_gate`` a full-attention layer (its output gate) and one
    ``sigmoid_gate_add`` a sparse block (the shared expert's gate and sum) per forward; with
    ``swiglu`` off, PyTorch's sigmoid and products (and still upstream's logits)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Calls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "tilegym":
                self.n[func._opname] = self.n.get(func._opname, 0) + 1
            return func(*args, **(kwargs or {}))

    base, patched, _ = _pair(**({off: False} if off else {}))
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    with Calls() as calls, torch.no_grad():
        got = patched(input_ids=ids, attention_mask=mask).logits
    full = base.config.layer_types.count("full_attention")
    gates = 0 if off else 1
    assert calls.n.get("sigmoid_gate", 0) == gates * full
    assert calls.n.get("sigmoid_gate_add", 0) == gates * base.config.num_hidden_layers
    with torch.no_grad():
        want = base(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-4, atol=1e-4)
