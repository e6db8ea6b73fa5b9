"""Every benchmark preset: its bundled config builds in the installed transformers as its model
type, a full preset names the checkpoint it reproduces (and the parameter count it states is the
model's), and a tiny preset is a CPU-sized model of the same family that keeps every feature of
its full preset's architecture (biases, packed projections, norms, window and RoPE kinds)."""

import json
import re
from importlib import resources

import pytest
import torch
from tilegym_hf_bench.presets import PRESETS, config_dict
from transformers import AutoConfig, AutoModelForCausalLM

FULL = sorted(k for k, p in PRESETS.items() if not p.cpu_sized)
TINY = sorted(k for k, p in PRESETS.items() if p.cpu_sized)
UNREDUCED_MAX_PARAMS = 8_500_000_000  # above ~8B a preset is a layer-reduced variant
COUNT = re.compile(r"\d{1,3}(?:,\d{3}){2,}")  # "7,248,023,552"
#: tiny presets with more than 2 layers: one whole period of a per-layer pattern (SmolLM3's
#: every 4th layer has no RoPE)
TINY_LAYERS = {"tiny-smollm3": 4, "tiny-olmo3": 4, "tiny-qwen3_5": 4, "tiny-qwen3_next": 4}


def annotations(key: str) -> dict:
    file = resources.files("tilegym_hf_bench").joinpath("configs", PRESETS[key].config_file)
    return {k: v for k, v in json.loads(file.read_text()).items() if k.startswith("_")}


def build(key: str, device: str = "meta"):
    config = AutoConfig.for_model(**config_dict(PRESETS[key]))
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config)
    return config, model.eval()


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def layer_parameters(model) -> set[str]:
    """Parameter names with the layer index folded: the same set means the same modules."""
    return {re.sub(r"\.layers\.\d+\.", ".layers.*.", n) for n, _ in model.named_parameters()}


def rope_kinds(config):
    params = config.rope_parameters
    if params and all(isinstance(v, dict) for v in params.values()):  # one per layer type
        return {kind: p.get("rope_type") for kind, p in params.items()}
    return params.get("rope_type") if params else None


def test_full_and_tiny_presets_pair_up():
    assert TINY and all(key.startswith("tiny-") for key in TINY)
    assert all("-" not in key for key in FULL)
    assert sorted(key.removeprefix("tiny-") for key in TINY) == FULL


@pytest.mark.parametrize("key", sorted(PRESETS))
def test_every_preset_config_builds_as_its_model_type(key):
    preset = PRESETS[key]
    raw = config_dict(preset)
    config, model = build(key)
    assert preset.key == key
    assert config.model_type == raw["model_type"] == preset.model_type
    assert type(model).__name__ == raw["architectures"][0]
    assert annotations(key)["_source"].strip()


@pytest.mark.parametrize("key", FULL)
def test_a_full_preset_names_its_checkpoint_and_its_size(key):
    preset = PRESETS[key]
    source = annotations(key)["_source"]
    assert preset.architecture in source
    n = n_params(build(key)[1])
    assert n <= UNREDUCED_MAX_PARAMS or "layer" in source
    stated = COUNT.findall(source)
    if stated:  # the count a _source states is this config's
        assert int(stated[0].replace(",", "")) == n


@pytest.mark.parametrize("key", TINY)
def test_a_tiny_preset_is_cpu_sized_and_runs_a_forward_on_the_cpu(key):
    config, model = build(key, "cpu")
    assert PRESETS[key].cpu_sized and config.num_hidden_layers == TINY_LAYERS.get(key, 2)
    assert n_params(model) < 1_000_000
    ids = torch.randint(0, config.vocab_size, (2, 80), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (2, 80, config.vocab_size) and torch.isfinite(logits).all()


@pytest.mark.parametrize("key", TINY)
def test_a_tiny_preset_keeps_its_familys_architecture(key):
    full_key = key.removeprefix("tiny-")
    assert PRESETS[full_key].model_type == PRESETS[key].model_type
    tiny_config, tiny = build(key)
    full_config, full = build(full_key)
    # the same modules: biases, packed projections, q/k norms, pre/post norms, untied lm_head
    assert layer_parameters(tiny) == layer_parameters(full)
    # every switch of the published config: activation, bias and tying flags, soft-capping,
    # sliding-window and cache settings (numbers shrink, flags do not)
    tiny_raw, full_raw = config_dict(PRESETS[key]), config_dict(PRESETS[full_key])
    flags = {k for k, v in full_raw.items() if v is None or isinstance(v, (bool, str))}
    assert {k: tiny_raw.get(k) for k in flags} == {k: full_raw[k] for k in flags}
    assert rope_kinds(tiny_config) == rope_kinds(full_config)
    tiny_kinds = set(getattr(tiny_config, "layer_types", None) or [])
    assert tiny_kinds == set(getattr(full_config, "layer_types", None) or [])
    windowed = [getattr(c, "sliding_window", None) is None for c in (tiny_config, full_config)]
    assert windowed[0] == windowed[1]
    mha = [c.num_key_value_heads == c.num_attention_heads for c in (tiny_config, full_config)]
    assert mha[0] == mha[1]
