"""The patched model under a static cache and torch.compile (issue: cuTile under CUDA graphs).

CPU: the cuTile ops are custom ops with PyTorch implementations on the CPU, so the patched
decode step traces with ``fullgraph=True`` here, compiles once, writes the static cache in place
(no copy of it in the generated code) and generates the baseline's tokens; ``undo()`` and a second,
unpatched model in the same process keep working. GPU: the compiled decode step replayed as a
CUDA graph over many steps gives the eager step's logits at cache positions from 1 to 8K, batch
1 and 8, both families, and never recompiles.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import pytest
import torch
from cpu_generate import greedy
from test_attention_model import _cache_kwarg, _left_padded, _model
from transformers import AutoConfig, AutoModelForCausalLM, CompileConfig, StaticCache
from transformers.masking_utils import create_masks_for_generate

import tilegym.transformers
from tilegym.ops.testing import rel_err
from tilegym.transformers import monkey_patch as mp

FAMILIES = ["qwen3", "llama"]


def _cpu_compile_config() -> CompileConfig:
    cfg = CompileConfig(fullgraph=True, backend="inductor", mode="default")
    cfg._compile_all_devices = True  # transformers compiles the decode step on GPUs only
    return cfg


def _static(model, ids, mask, n):
    return greedy(
        model, ids, mask, n, cache_implementation="static", compile_config=_cpu_compile_config()
    )


def _patched_pair(model_key: str):
    base = _model(model_key)
    patched = copy.deepcopy(base)
    handle = mp.apply_tilegym_kernel(patched)
    assert handle.applied == list(mp.FLAGS), handle.not_applied
    return base, patched, handle


@pytest.mark.slow
@pytest.mark.parametrize("model_key", FAMILIES)
def test_static_generate_compiles_the_patched_decode_step_once_with_fullgraph(model_key):
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    base, patched, _ = _patched_pair(model_key)
    ids, mask = _left_padded([9, 4])
    want = greedy(base, ids, mask, 6)
    counters.clear()
    got, code = run_and_get_code(lambda: _static(patched, ids, mask, 6))
    assert torch.equal(got, want)
    assert counters["stats"]["unique_graphs"] == 1  # one decode graph for every step
    code = "\n".join(code)
    assert "torch.ops.tilegym.kv_cache_write_at" in code
    assert "torch.ops.tilegym.decode_attention" in code
    # the static cache is written in place by the cuTile op: no functional copy written back
    assert not re.search(r"index_copy|aten\.copy_|\.copy_\(", code), "the KV cache is copied"
    with torch.compiler.set_stance("fail_on_recompile"):
        assert torch.equal(_static(patched, ids, mask, 6), want)  # a second generate: replays


def _gemma3():
    """Gemma 3 at attention-kernel head size: a sliding-window layer (window 4, shorter than
    the prompts) then a global one."""
    cfg = AutoConfig.for_model(
        "gemma3_text",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        query_pre_attn_scalar=64,
        vocab_size=512,
        sliding_window=4,
        sliding_window_pattern=2,
        initializer_range=0.05,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).eval()


@pytest.mark.slow
def test_gemma3_static_generate_compiles_like_the_unpatched_model():
    """Gemma 3 under a static cache: the global layer's cache is written in place by the cuTile
    op at the device position and read by the decode kernel, as for qwen3/llama. Its sliding
    layer (window 4, full after the prompt) is kept as a ring buffer, one slot written per step
    instead of the window rolled; its fill is a host int, which costs the unpatched model one
    recompile (the int turns symbolic); the patched model compiles no more often, matches the
    eager tokens over 8 steps (the ring wraps twice) and then replays."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    base = _gemma3()
    patched = copy.deepcopy(base)
    handle = mp.apply_tilegym_kernel(patched)
    assert handle.applied == list(mp.FLAGS), handle.not_applied
    ids, mask = _left_padded([9, 4])
    want = greedy(base, ids, mask, 8)
    graphs = {}
    for name, model in (("base", base), ("patched", patched)):
        torch._dynamo.reset()
        counters.clear()
        got, code = run_and_get_code(lambda m=model: _static(m, ids, mask, 8))
        assert torch.equal(got, want), name
        graphs[name] = counters["stats"]["unique_graphs"]
    assert graphs["patched"] <= graphs["base"], graphs
    code = "\n".join(code)
    assert "torch.ops.tilegym.kv_cache_write_at" in code
    assert "torch.ops.tilegym.kv_cache_ring_write" in code
    assert "torch.ops.tilegym.decode_attention" in code
    assert "roll" not in code  # the sliding layer's window is not rolled per step
    with torch.compiler.set_stance("fail_on_recompile"):
        assert torch.equal(_static(patched, ids, mask, 8), want)


def _gemma3_pair():
    """(the tiny Gemma 3, a patched copy), with Dynamo's caches cleared for a fresh compile."""
    torch._dynamo.reset()
    base = _gemma3()
    patched = copy.deepcopy(base)
    mp.apply_tilegym_kernel(patched)
    return base, patched


def test_gemma3_ring_window_with_padding_inside_it_generates_the_unpatched_tokens():
    """The shorter row's three padding tokens are still in the first full window (tokens 2..5
    of a 4-token window): the ring's rotated key validity must keep masking them as the ring
    wraps."""
    base, patched = _gemma3_pair()
    ids, mask = _left_padded([5, 2])
    want = greedy(base, ids, mask, 9)
    assert torch.equal(_static(patched, ids, mask, 9), want)


def _continued(model, ids, mask, steps):
    """Greedy generation in two calls sharing one static cache: the second call's prompt (the
    first call's tokens plus two more) is several new tokens on a full sliding window."""
    cache = StaticCache(config=model.config, max_cache_len=ids.shape[1] + 2 * steps + 2)
    kw = {_cache_kwarg(model): cache}
    first = greedy(model, ids, mask, steps, compile_config=_cpu_compile_config(), **kw)
    more = torch.tensor([[7, 11]] * ids.shape[0])
    ids2 = torch.cat([ids, first, more], dim=1)
    mask2 = torch.cat([mask, torch.ones_like(first), torch.ones_like(more)], dim=1)
    second = greedy(model, ids2, mask2, steps, compile_config=_cpu_compile_config(), **kw)
    return first, second


@pytest.mark.slow
def test_gemma3_ring_window_survives_a_continuation_on_the_same_cache():
    """Several new tokens on a full ring window (a chat continuation) go through transformers'
    update on the window in token order (rotated before, back into ring order after): the
    second call generates the unpatched model's tokens."""
    base, patched = _gemma3_pair()
    ids, mask = _left_padded([9, 6])
    want = _continued(base, ids, mask, 5)
    torch._dynamo.reset()
    got = _continued(patched, ids, mask, 5)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_gemma3_ring_window_on_a_kept_cache_starts_over_after_a_reset():
    """The static-mode benchmark keeps one cache per side and resets it before every
    ``generate()``: a ring window that wrapped in one call starts empty in the next, and both
    calls generate the unpatched model's tokens."""
    base, patched = _gemma3_pair()
    ids, mask = _left_padded([9, 6])
    want = greedy(base, ids, mask, 7)
    cache = StaticCache(config=patched.config, max_cache_len=ids.shape[1] + 7)
    kw = {_cache_kwarg(patched): cache, "compile_config": _cpu_compile_config()}
    for _ in range(2):
        cache.reset()
        assert torch.equal(greedy(patched, ids, mask, 7, **kw), want)


def _graph_symbols(model, ids, mask) -> tuple[set[str], str]:
    """The symbolic ints of the compiled static decode step (its varying host inputs) and its
    generated code."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    _, code = run_and_get_code(lambda: _static(model, ids, mask, 6))
    code = "\n".join(code)
    return set(re.findall(r"\bs\d+\b", code)), code


@pytest.mark.slow
def test_a_window_longer_than_the_static_cache_adds_no_symbolic_input():
    """Phi-3.5's 262144-token window makes every layer of a static cache a
    ``StaticSlidingWindowLayer``, which counts its fill in a host int. The patched decode step
    takes no symbolic input the unpatched one does not (a symbolic position reaching the
    attention op made CUDA graph trees record a graph per step: 25 tok/s against 172), and its
    attention reads the position on the device."""
    from test_attention_model import _config

    cfg = _config(
        "qwen3", tiny=True, use_sliding_window=True, sliding_window=262144, max_window_layers=0
    )
    base = _model("qwen3", cfg)
    patched = copy.deepcopy(base)
    mp.apply_tilegym_kernel(patched)
    ids, mask = _left_padded([9, 4])
    base_symbols, _ = _graph_symbols(base, ids, mask)
    symbols, code = _graph_symbols(patched, ids, mask)
    assert len(symbols) <= len(base_symbols), (symbols, base_symbols)
    calls = [line for line in code.splitlines() if "torch.ops.tilegym.decode_attention" in line]
    assert calls and not any(re.search(r"\bs\d+\b", line) for line in calls), calls


@pytest.mark.slow
def test_undo_and_an_unpatched_model_in_the_same_process_keep_working():
    torch._dynamo.reset()
    base, patched, handle = _patched_pair("qwen3")
    ids, mask = _left_padded([5])
    want = greedy(base, ids, mask, 5)
    assert torch.equal(_static(patched, ids, mask, 5), want)
    assert torch.equal(_static(base, ids, mask, 5), want)  # the unpatched model, compiled too
    handle.undo()
    assert torch.equal(_static(patched, ids, mask, 5), want)
    assert not any("_tilegym_fused" in k for m in patched.modules() for k in vars(m))


def test_static_cache_mask_keeps_the_position_on_the_device():
    """The mask of a static cache's decode step carries the cache position as an int32 device
    tensor copied from the layer's counter (not read on the host, not an alias of it)."""
    from tilegym.transformers.attention import TileMask, tilegym_mask

    counter = torch.tensor(41)
    mask = tilegym_mask(2, 1, 64, q_offset=counter, attention_mask=torch.ones(2, 42))
    assert isinstance(mask, TileMask) and mask.key_valid is None
    assert mask.q_start.dtype == torch.int32 and mask.q_start.tolist() == [41]
    counter.add_(1)
    assert mask.q_start.tolist() == [41]
    padded = torch.ones(2, 42)
    padded[1, :3] = 0
    mask = tilegym_mask(2, 1, 64, q_offset=counter, attention_mask=padded)
    assert mask.key_valid.shape[0] == 2 and mask.key_valid[1, :3].eq(0).all()
    assert mask.key_valid[0, :42].eq(1).all()


# ------------------------------------------------------------------ GPU: CUDA-graph replay

STEPS = 6
CAPACITY = 8192 + 16
PROMPTS = [1, 300, 8000]


def _gpu_model(model_type: str):
    path = Path(tilegym.transformers.__file__).parent / model_type / "small_config.json"
    cfg = AutoConfig.for_model(**json.loads(path.read_text()))
    cfg._attn_implementation = "sdpa"
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).cuda().to(torch.bfloat16).eval()
    mp.apply_tilegym_kernel(model)
    return model


class _Decoder:
    """Prefill eagerly into a fresh static cache, then teacher-forced decode steps through
    ``step`` (the eager forward or its compiled CUDA-graph version), as ``generate`` does."""

    def __init__(self, model, step, ids, mask):
        self.model, self.step, self.mask = model, step, mask
        self.cache = StaticCache(config=model.config, max_cache_len=CAPACITY)
        self.kw = _cache_kwarg(model)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        self.logits = [self._forward(model, ids, pos)]

    def _forward(self, fn, ids, pos):
        b, s = ids.shape
        masks = create_masks_for_generate(
            config=self.model.config,
            inputs_embeds=torch.empty((b, s, 0), dtype=torch.bfloat16, device=ids.device),
            attention_mask=self.mask,
            position_ids=pos,
            **{self.kw: self.cache},
        )
        with torch.no_grad():
            out = fn(input_ids=ids, attention_mask=masks, position_ids=pos, **{self.kw: self.cache})
        return out.logits[:, -1].float().clone()

    def decode(self, token):
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=-1)
        pos = (self.mask.sum(-1, keepdim=True) - 1).long()
        self.logits.append(self._forward(self.step, token, pos))


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("model_key", sorted(mp.FAMILIES))
def test_cuda_graph_replay_matches_the_eager_decode_step(model_key, batch):
    torch._dynamo.reset()
    model = _gpu_model(model_key)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    gen = torch.Generator(device="cuda").manual_seed(batch)
    compiled_for = set()  # padded or not: the mask's key validity is a graph input or absent;
    # and for transformers' static sliding-window layers (Gemma 3) whether the window is full:
    # they branch on that host-side fill, one graph each way (the unpatched model's too)
    types = getattr(model.config, "layer_types", None) or ()
    window = model.config.sliding_window if "sliding_attention" in types else None
    for prompt in PROMPTS:
        lengths = [prompt] + [max(1, prompt - 37 * j) for j in range(1, batch)]
        ids, mask = _left_padded(lengths, gen, device="cuda")
        tokens = torch.randint(1, 4096, (batch, STEPS), generator=gen, device="cuda")
        eager = _Decoder(model, model, ids, mask)
        graph = _Decoder(model, compiled, ids, mask)
        state = (bool((mask == 0).any()), window is not None and ids.shape[1] >= window)
        for t in range(STEPS):
            eager.decode(tokens[:, t : t + 1])
            if state not in compiled_for and t < 2:  # compile and record, then replay only
                graph.decode(tokens[:, t : t + 1])
                continue
            compiled_for.add(state)
            with torch.compiler.set_stance("fail_on_recompile"):
                graph.decode(tokens[:, t : t + 1])
        for t, (a, b) in enumerate(zip(graph.logits, eager.logits, strict=True)):
            assert torch.isfinite(a).all(), (prompt, t)
            assert rel_err(a, b) < 2e-2, (prompt, t, rel_err(a, b))
        full = next(la for la in graph.cache.layers if not getattr(la, "is_sliding", False))
        assert int(full.cumulative_length) == ids.shape[1] + STEPS
