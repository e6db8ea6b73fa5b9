"""Every family's rotary tables on the cuTile op (``tilegym.transformers.rope_tables``), on the CPU.

The patched rotary module must hand out upstream's tables (gpt-oss's half-width ones too), through
the ``tilegym::rotary_tables`` op,
for every family whose module is Llama's form; modules of other forms, rope types that move
their frequencies per call and positions that are not ``[B, S]`` keep upstream's forward.
"""

from __future__ import annotations

import pytest
import torch
from cpu_generate import small_family_pair
from torch.utils._python_dispatch import TorchDispatchMode

from tilegym.transformers import monkey_patch as mp
from tilegym.transformers import rope_tables as rt

FAMILIES = sorted(mp.FAMILIES)
#: families whose rotary keeps upstream's forward at their benchmark preset, and why
KEEPS_ITS_OWN = {
    "deepseek_v2": "its own RotaryEmbedding builder (the complex table, tilegym.transformers.mla)",
    "phi3": "longrope (frequencies chosen per call) and 48 frequencies at head_dim 96",
    "qwen3_5": "M-RoPE: the model hands its rotary three rows of positions",
}
#: the same at the small test configs (heads of 64, default rope)
SMALL_KEEPS = ("deepseek_v2", "qwen3_5")


class _OpCalls(TorchDispatchMode):
    """Counts the ``tilegym::rotary_tables`` calls made under it."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.name().startswith("tilegym::rotary_tables"):
            self.calls += 1
        return func(*args, **(kwargs or {}))


def _tables(rotary, x, pos, layer_type=None):
    extra = () if layer_type is None else (layer_type,)
    with torch.no_grad():
        return rotary(x, pos, *extra)


def _rotary(model, model_type):
    prefix = mp.FAMILIES[model_type].description().class_prefix
    return rt.rotary_modules(model, prefix)


def _routed(module) -> bool:
    forward = module.__dict__.get("forward")
    return forward is not None and forward.__func__.__module__ == rt.__name__


@pytest.mark.parametrize("model_type", FAMILIES)
def test_the_patched_rotary_hands_out_upstream_tables_from_the_op(model_type):
    base, patched, _ = small_family_pair(model_type)
    ours, theirs = _rotary(patched, model_type), _rotary(base, model_type)
    if model_type in SMALL_KEEPS:
        assert not any(_routed(m) for m in ours), KEEPS_ITS_OWN[model_type]
        return
    assert ours and all(_routed(m) for m in ours) and len(ours) == len(theirs)
    gen = torch.Generator().manual_seed(3)
    pos = torch.randint(0, 131072, (3, 7), generator=gen)
    x = torch.zeros(3, 7, 128)
    for mine, upstream in zip(ours, theirs, strict=True):
        kinds = rt.layer_types(upstream) or [None]
        for kind in kinds:
            want = _tables(upstream, x, pos, kind)
            with _OpCalls() as seen:
                got = _tables(mine, x, pos, kind)
            assert seen.calls == 1, kind
            for g, w in zip(got, want, strict=True):
                assert g.dtype == w.dtype and g.shape == w.shape
                torch.testing.assert_close(g, w, rtol=0, atol=1e-6)
            half = want[0].shape[-1] == rt._frequencies(upstream, kind)[0].shape[0]
            assert half == (model_type == "gpt_oss")


def test_positions_that_are_not_b_by_s_go_to_upstreams_forward():
    """Three dims of positions: upstream's forward answers (5.24 broadcasts them; 5.17's
    matmul form refuses them), the op is not called."""
    base, patched, _ = small_family_pair("qwen3")
    (mine,), (upstream,) = _rotary(patched, "qwen3"), _rotary(base, "qwen3")
    pos = torch.arange(5)[None, None].expand(1, 2, 5)
    x = torch.zeros(1, 5, 128)
    try:
        want = _tables(upstream, x, pos)
    except RuntimeError as upstream_error:
        with _OpCalls() as seen, pytest.raises(type(upstream_error)):
            _tables(mine, x, pos)
        assert seen.calls == 0
        return
    with _OpCalls() as seen:
        got = _tables(mine, x, pos)
    assert seen.calls == 0
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_dynamic_rope_keeps_its_own_forward():
    _, patched, _ = small_family_pair("llama")
    (rotary,) = _rotary(patched, "llama")
    rotary.rope_type = "dynamic"
    assert rt.table_form(rotary) is None
    rotary.rope_type = "default"
    assert rt.table_form(rotary) is not None


def test_a_module_of_another_form_is_not_routed():
    """A rotary whose tables differ from Llama's (here: the sine's sign flipped, as a
    clockwise rotation would be) fails the probe and keeps its forward."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    class Clockwise(LlamaRotaryEmbedding):
        def forward(self, x, position_ids):
            cos, sin = super().forward(x, position_ids)
            return cos, -sin

    base, _, _ = small_family_pair("llama")
    own = Clockwise(base.config)
    assert rt.table_form(own) is None
    assert rt.make_forward(own) is None
    plain = LlamaRotaryEmbedding(base.config)
    assert rt.table_form(plain) == rt.TableForm(half=False, keeps_fp32=False)


def test_frequencies_the_kernel_cannot_take_keep_the_module():
    base, _, _ = small_family_pair("llama")
    (rotary,) = _rotary(base, "llama")
    rotary.inv_freq = rotary.inv_freq[:24].clone()  # 24: not a power of two
    assert rt.table_form(rotary) is None


def test_undo_gives_the_rotary_its_forward_back():
    base, patched, handle = small_family_pair("qwen3")
    (rotary,) = _rotary(patched, "qwen3")
    assert "forward" in rotary.__dict__
    handle.undo()
    assert "forward" not in rotary.__dict__


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_benchmark_preset_gets_the_op_but_the_listed_ones(model_type):
    """The rotary module built from the benchmark's preset config (the architecture the GPU
    runs): Llama's form is routed, the three listed families keep their own."""
    import importlib
    import json
    from pathlib import Path

    import tilegym_hf_bench
    from transformers import AutoConfig

    desc = mp.FAMILIES[model_type].description()
    preset = Path(tilegym_hf_bench.__file__).parent / "configs" / f"{model_type}.json"
    config = AutoConfig.for_model(**json.loads(preset.read_text())).get_text_config()
    upstream = importlib.import_module(desc.upstream_module)
    (name,) = [
        n
        for n in vars(upstream)
        if n.startswith(desc.class_prefix) and n.endswith("RotaryEmbedding") and "Vision" not in n
    ]
    rotary = getattr(upstream, name)(config)
    picked = rt.rotary_modules(torch.nn.ModuleList([rotary]), desc.class_prefix)
    routed = bool(picked) and rt.make_forward(rotary) is not None
    if "RotaryEmbedding" in desc.forwards:
        routed = False  # the family's own builder runs instead
    assert routed == (model_type not in KEEPS_ITS_OWN), KEEPS_ITS_OWN.get(model_type)


@pytest.mark.gpu
@pytest.mark.parametrize("model_type", ["qwen3", "gpt_oss", "olmo3", "gemma3", "deepseek_v3"])
def test_the_cutile_tables_are_upstreams_on_the_gpu(model_type):
    """On the GPU the patched module runs the cuTile kernel: bf16 tables within one rounding
    step of upstream's (a cosine a hair from a rounding boundary may land on the other side),
    OLMo's fp32 ones within the kernel's angle reduction."""
    base, patched, _ = small_family_pair(model_type, dtype=torch.bfloat16)
    base, patched = base.cuda(), patched.cuda()
    gen = torch.Generator(device="cuda").manual_seed(5)
    pos = torch.randint(0, 131072, (3, 37), generator=gen, device="cuda")
    x = torch.zeros(3, 37, 128, dtype=torch.bfloat16, device="cuda")
    for mine, upstream in zip(_rotary(patched, model_type), _rotary(base, model_type), strict=True):
        for kind in rt.layer_types(upstream) or [None]:
            want, got = _tables(upstream, x, pos, kind), _tables(mine, x, pos, kind)
            for g, w in zip(got, want, strict=True):
                assert g.dtype == w.dtype and g.shape == w.shape
                bar = 2e-5 if w.dtype == torch.float32 else 2.0**-7
                assert (g.float() - w.float()).abs().max().item() <= bar
