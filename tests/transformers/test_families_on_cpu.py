"""Every family's patched model against its unpatched twin on the CPU (fp32).

On a CPU the cuTile ops run their PyTorch implementations (``tilegym.ops.library``), so what
these tests check is the glue: that each family's description (projection names, packed
weights, biases, q/k norms, window source) routes the upstream model's computation exactly,
eagerly, through ``generate()`` with left padding, and compiled with a static cache.
"""

from __future__ import annotations

import pytest
import torch
from cpu_generate import assert_same_as_upstream, greedy, left_padded_batch
from cpu_generate import small_family_pair as _pair
from transformers import CompileConfig

from tilegym.transformers import monkey_patch as mp

FAMILIES = sorted(mp.FAMILIES)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_the_patched_family_computes_the_upstream_model(model_type):
    base, patched, handle = _pair(model_type)
    assert handle.applied == list(mp.FLAGS), handle.not_applied
    ids, mask = left_padded_batch()
    assert_same_as_upstream(base, patched, ids, mask)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", FAMILIES)
def test_the_patched_family_compiles_with_a_static_cache(model_type):
    torch._dynamo.reset()
    base, patched, _ = _pair(model_type)
    ids, mask = left_padded_batch()
    cfg = CompileConfig(fullgraph=True, backend="aot_eager")
    cfg._compile_all_devices = True
    got = greedy(patched, ids, mask, cache_implementation="static", compile_config=cfg)
    assert torch.equal(got, greedy(base, ids, mask))


@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_decode_rope_heads_reach_the_ops_and_compute_the_same_model(model_type):
    """``rope_heads`` (a tuning parameter, not a flag) goes through the custom ops' schema into
    the RoPE kernels' dispatch, eagerly and in a compiled static decode step, and changes no
    value (on a CPU the ops run their references)."""
    torch._dynamo.reset()
    base, patched, handle = _pair(model_type, rope_heads=2)
    assert handle.applied == list(mp.FLAGS), handle.not_applied
    ids, mask = left_padded_batch()
    assert_same_as_upstream(base, patched, ids, mask)
    cfg = CompileConfig(fullgraph=True, backend="aot_eager")
    cfg._compile_all_devices = True
    got = greedy(patched, ids, mask, cache_implementation="static", compile_config=cfg)
    assert torch.equal(got, greedy(base, ids, mask))


def _op_calls(model, ids, mask) -> dict[str, int]:
    """How often each tilegym custom op ran in one forward (on the CPU: their references)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(input_ids=ids, attention_mask=mask)
    calls: dict[str, int] = {}
    for event in prof.events():
        if event.name.startswith("tilegym::"):
            calls[event.name] = calls.get(event.name, 0) + 1
    return calls


PLAIN_PRE_NORM = ("qwen3", "llama", "mistral", "qwen2", "granite", "phi3")
POST_NORM = ("olmo2", "olmo3")  # whole-projection q/k norms, no input norm
GATED = ("tilegym::fused_gate_up_silu", "tilegym::fused_gate_up_gelu_tanh")


@pytest.mark.parametrize("norm_gemv", [1, 2])
@pytest.mark.parametrize("model_type", FAMILIES)
def test_norm_gemv_moves_each_norm_into_the_next_gemm(model_type, norm_gemv):
    """``norm_gemv=1``: every layer on the shared pre-norm forwards calls ``rms_norm_linear``
    (its input norm and QKV GEMM) where it called ``rms_norm`` then ``linear``; 2: a dense MLP
    after a residual-folding o_proj also calls ``rms_norm_gate_up`` where it called ``rms_norm``
    then the fused gate/up GEMM. A post-norm layer (OLMo 2/3) at 2 calls
    ``add_rms_norm_gate_up`` (its attention's norm, residual add and gate/up) where it called
    ``rms_norm_add`` then the gate/up GEMM. Layers with forwards of their own keep both; the
    model computes upstream's, with left padding."""
    ids, mask = left_padded_batch()
    _, plain, _ = _pair(model_type)
    base, fused, handle = _pair(model_type, norm_gemv=norm_gemv)
    assert handle.applied == list(mp.FLAGS), handle.not_applied
    assert_same_as_upstream(base, fused, ids, mask)
    before, after = _op_calls(plain, ids, mask), _op_calls(fused, ids, mask)
    qkv = after.get("tilegym::rms_norm_linear", 0)
    mlp = after.get("tilegym::rms_norm_gate_up", 0)
    assert before.get("tilegym::rms_norm", 0) - after.get("tilegym::rms_norm", 0) == qkv + mlp
    assert before.get("tilegym::linear", 0) - after.get("tilegym::linear", 0) == qkv
    post = after.get("tilegym::add_rms_norm_gate_up", 0)
    gated = sum(before.get(n, 0) - after.get(n, 0) for n in GATED)
    assert gated == mlp + post
    added = before.get("tilegym::rms_norm_add", 0) - after.get("tilegym::rms_norm_add", 0)
    assert added == post
    layers = fused.config.num_hidden_layers
    if model_type in PLAIN_PRE_NORM:
        assert (qkv, mlp) == (layers, layers if norm_gemv == 2 else 0)
    if model_type in POST_NORM:
        assert (qkv, mlp, post) == (0, 0, layers if norm_gemv == 2 else 0)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_rope_gemv_rotates_in_the_qkv_gemv_at_one_row(model_type):
    """``rope_gemv=1`` (with ``norm_gemv``): a one-row call of a layer on the shared pre-norm
    forwards whose heads have only q/k norms before RoPE (no output gate) runs
    ``rms_norm_linear_rope`` (norm, QKV, q/k norms and RoPE in one op) and no RoPE or q/k-norm
    op; more rows keep ``rms_norm_linear`` and those ops. A post-norm layer (OLMo 2/3: no input
    norm, whole-projection q/k norms) runs it too, without the norm. Batch-1 greedy decode,
    eager and compiled with a static cache, computes upstream's."""
    torch._dynamo.reset()
    ids, mask = left_padded_batch(pads=(0,))
    base, fused, handle = _pair(model_type, norm_gemv=1, rope_gemv=1)
    assert handle.applied == list(mp.FLAGS), handle.not_applied
    assert_same_as_upstream(base, fused, ids, mask)
    prompt = _op_calls(fused, ids, mask)
    one_row = _op_calls(fused, ids[:, :1], mask[:, :1])
    assert "tilegym::rms_norm_linear_rope" not in prompt
    rotated = one_row.get("tilegym::rms_norm_linear_rope", 0)
    layers = fused.config.num_hidden_layers
    if model_type in PLAIN_PRE_NORM:
        assert rotated == layers, one_row
        assert not {"tilegym::apply_rope", "tilegym::qk_norm_rope"} & set(one_row), one_row
        assert prompt.get("tilegym::rms_norm_linear", 0) == layers
    if model_type in POST_NORM:
        assert rotated == layers, one_row
        assert "tilegym::qk_norm_whole_rope" not in one_row, one_row
        assert prompt.get("tilegym::qk_norm_whole_rope", 0) == layers
    cfg = CompileConfig(fullgraph=True, backend="aot_eager")
    cfg._compile_all_devices = True
    got = greedy(fused, ids, mask, cache_implementation="static", compile_config=cfg)
    assert torch.equal(got, greedy(base, ids, mask))


@pytest.mark.parametrize("model_type", PLAIN_PRE_NORM)
def test_rope_gemv_2_writes_the_static_cache_in_the_qkv_gemv(model_type):
    """``rope_gemv=2``: every decode step's layers write their new keys and values into the
    static cache in the norm + QKV + RoPE op (``rms_norm_linear_rope_cache``), where
    ``rope_gemv=1`` calls the KV-cache write op once a layer a step (the prompt's pass goes
    through transformers' ``update``). Greedy decode with a static cache, eager and compiled,
    computes upstream's tokens."""
    torch._dynamo.reset()
    ids, mask = left_padded_batch(pads=(0,))
    base, fused, handle = _pair(model_type, norm_gemv=1, rope_gemv=2)
    assert handle.applied == list(mp.FLAGS), handle.not_applied
    steps, calls = _static_decode_calls(base, fused, ids, mask)
    layers = fused.config.num_hidden_layers
    assert calls.get("tilegym::rms_norm_linear_rope_cache", 0) == layers * steps, calls
    assert "tilegym::kv_cache_write_at" not in calls, calls


def _static_decode_calls(base, fused, ids, mask) -> tuple[int, dict[str, int]]:
    """Greedy decode of ``fused`` with a static cache, eager and compiled, equal to ``base``'s
    tokens; returns the new tokens after the prompt's (decode steps) and the ops the eager run
    called."""
    from torch.profiler import ProfilerActivity, profile

    want = greedy(base, ids, mask)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        got = greedy(fused, ids, mask, cache_implementation="static")
    assert torch.equal(got, want)
    calls: dict[str, int] = {}
    for event in prof.events():
        calls[event.name] = calls.get(event.name, 0) + 1
    cfg = CompileConfig(fullgraph=True, backend="aot_eager")
    cfg._compile_all_devices = True
    compiled = greedy(fused, ids, mask, cache_implementation="static", compile_config=cfg)
    assert torch.equal(compiled, want)
    return got.shape[1] - 1, calls  # the first new token comes from the prompt's pass


@pytest.mark.parametrize("norm_gemv", [0, 2])
@pytest.mark.parametrize("model_type", POST_NORM)
def test_rope_gemv_2_in_a_post_norm_layer_writes_each_full_attention_layer(model_type, norm_gemv):
    """``rope_gemv=2`` on OLMo's post-norm layers (no input norm): a full-attention layer's
    decode step writes its keys and values in the QKV + q/k norm + RoPE op; a sliding-window
    layer (OLMo 3's three of four) rotates in the same op and keeps its ring-buffer write. With
    ``norm_gemv=2`` too (the attention's norm and add in the gate/up op). Greedy decode with a
    static cache, eager and compiled, computes upstream's tokens."""
    torch._dynamo.reset()
    ids, mask = left_padded_batch(pads=(0,))
    base, fused, handle = _pair(model_type, rope_gemv=2, norm_gemv=norm_gemv)
    assert handle.applied == list(mp.FLAGS), handle.not_applied
    steps, calls = _static_decode_calls(base, fused, ids, mask)
    layers = len(fused.model.layers)
    types = getattr(fused.config, "layer_types", None) or ["full_attention"] * layers
    full, sliding = types.count("full_attention"), types.count("sliding_attention")
    assert calls.get("tilegym::rms_norm_linear_rope_cache", 0) == full * steps, calls
    assert calls.get("tilegym::rms_norm_linear_rope", 0) == sliding * steps, calls
    assert calls.get("tilegym::kv_cache_ring_write", 0) == sliding * steps, calls
    fused_mlp = calls.get("tilegym::add_rms_norm_gate_up", 0)
    assert fused_mlp == (layers * (steps + 1) if norm_gemv == 2 else 0), calls


@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_norm_gemv_compiles_with_a_static_cache(model_type):
    torch._dynamo.reset()
    base, patched, _ = _pair(model_type, norm_gemv=2)
    ids, mask = left_padded_batch()
    cfg = CompileConfig(fullgraph=True, backend="aot_eager")
    cfg._compile_all_devices = True
    got = greedy(patched, ids, mask, cache_implementation="static", compile_config=cfg)
    assert torch.equal(got, greedy(base, ids, mask))


@pytest.mark.parametrize("model_type", FAMILIES)
def test_rope_left_to_pytorch_keeps_the_model_dtype_for_a_static_cache(model_type):
    """rope=False runs the family's own ``apply_rotary_pos_emb``: in bf16, q and k stay bf16
    (OLMo 2's rotary module hands out fp32 cos/sin), so the static cache takes the keys."""
    base, patched, handle = _pair(model_type, torch.bfloat16, rope=False)
    assert "rope" in handle.not_applied
    ids, mask = left_padded_batch()
    got = greedy(patched, ids, mask, cache_implementation="static")
    want = greedy(base, ids, mask, cache_implementation="static")
    assert got.shape == want.shape
    with torch.no_grad():
        logits = patched(input_ids=ids, attention_mask=mask).logits
        ref = base(input_ids=ids, attention_mask=mask).logits
    valid = mask.bool()
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(logits[valid].float(), ref[valid].float(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("model_type", ["olmo2", "olmo3"])
@pytest.mark.parametrize("rms_norm", [True, False])
def test_post_norm_layers_add_their_norms_in_one_op(model_type, rms_norm):
    """A post-norm layer's two norm-then-add steps are one ``rms_norm_add`` each with
    ``rms_norm``, and the norms' forwards and PyTorch's adds without; upstream's model either
    way."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n[func._opname] = self.n.get(func._opname, 0) + 1
            return func(*args, **(kwargs or {}))

    base, patched, _ = _pair(model_type, rms_norm=rms_norm)
    ids, mask = left_padded_batch()
    with Ops() as ops, torch.no_grad():
        patched(input_ids=ids, attention_mask=mask)
    layers = patched.config.num_hidden_layers
    assert ops.n.get("rms_norm_add", 0) == (2 * layers if rms_norm else 0)
    assert_same_as_upstream(base, patched, ids, mask)
