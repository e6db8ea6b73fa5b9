"""Model presets: a model key names a config bundled in ``configs/`` (random weights).

Torch-free: the supervisor validates ``--model-key`` before it starts a worker.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any


@dataclass(frozen=True)
class Preset:
    key: str
    model_type: str  # the transformers submodule name; selects the patch flags
    architecture: str  # what the config reproduces, for the output
    config_file: str
    cpu_sized: bool  # small enough for a CPU run of the whole CLI


PRESETS: dict[str, Preset] = {
    "qwen3": Preset("qwen3", "qwen3", "Qwen/Qwen3-0.6B", "qwen3.json", False),
    "llama": Preset("llama", "llama", "meta-llama/Llama-3.2-1B", "llama.json", False),
    "tiny-qwen3": Preset("tiny-qwen3", "qwen3", "Qwen3, 2 small layers", "tiny-qwen3.json", True),
    "tiny-llama": Preset(
        "tiny-llama", "llama", "Llama 3.2, 2 small layers", "tiny-llama.json", True
    ),
    # gemma3: the text model (model type gemma3_text), patched by the family folder
    # src/tilegym/transformers/gemma3 (its MODEL_PATCH_KWARGS entry is keyed by the model type)
    "mistral": Preset("mistral", "mistral", "mistralai/Mistral-7B-v0.3", "mistral.json", False),
    "qwen2": Preset("qwen2", "qwen2", "Qwen/Qwen2.5-1.5B", "qwen2.json", False),
    "phi3": Preset("phi3", "phi3", "microsoft/Phi-3.5-mini-instruct", "phi3.json", False),
    "gemma3": Preset("gemma3", "gemma3_text", "google/gemma-3-1b-it", "gemma3.json", False),
    "olmo2": Preset("olmo2", "olmo2", "allenai/OLMo-2-0425-1B", "olmo2.json", False),
    # 8 of its 48 layers: the bf16 model and the fp32 reference fit one H200 (see its _source)
    "qwen3_moe": Preset("qwen3_moe", "qwen3_moe", "Qwen/Qwen3-30B-A3B", "qwen3_moe.json", False),
    "tiny-mistral": Preset(
        "tiny-mistral", "mistral", "Mistral v0.3, 2 small layers", "tiny-mistral.json", True
    ),
    "tiny-qwen2": Preset("tiny-qwen2", "qwen2", "Qwen2.5, 2 small layers", "tiny-qwen2.json", True),
    "tiny-phi3": Preset(
        "tiny-phi3", "phi3", "Phi-3.5-mini, 2 small layers", "tiny-phi3.json", True
    ),
    "tiny-gemma3": Preset(
        "tiny-gemma3", "gemma3_text", "Gemma 3 1B, 2 small layers", "tiny-gemma3.json", True
    ),
    "tiny-olmo2": Preset(
        "tiny-olmo2", "olmo2", "OLMo 2 1B, 2 small layers", "tiny-olmo2.json", True
    ),
    "tiny-qwen3_moe": Preset(
        "tiny-qwen3_moe", "qwen3_moe", "Qwen3-30B-A3B, 2 small layers", "tiny-qwen3_moe.json", True
    ),
    "granite": Preset(
        "granite", "granite", "ibm-granite/granite-3.3-2b-instruct", "granite.json", False
    ),
    "smollm3": Preset("smollm3", "smollm3", "HuggingFaceTB/SmolLM3-3B", "smollm3.json", False),
    "tiny-granite": Preset(
        "tiny-granite", "granite", "Granite 3.3 2B, 2 small layers", "tiny-granite.json", True
    ),
    # 4 layers: one whole NoPE period (the 4th layer has no RoPE)
    "tiny-smollm3": Preset(
        "tiny-smollm3", "smollm3", "SmolLM3-3B, 4 small layers", "tiny-smollm3.json", True
    ),
    "olmo3": Preset("olmo3", "olmo3", "allenai/Olmo-3-1025-7B", "olmo3.json", False),
    "olmoe": Preset("olmoe", "olmoe", "allenai/OLMoE-1B-7B-0924", "olmoe.json", False),
    # 4 of its 32 layers: the bf16 model and the fp32 reference fit one H200 (see its _source)
    "mixtral": Preset("mixtral", "mixtral", "mistralai/Mixtral-8x7B-v0.1", "mixtral.json", False),
    # 4 layers: one whole layer_types period (three sliding-window layers, one full)
    "tiny-olmo3": Preset(
        "tiny-olmo3", "olmo3", "Olmo 3 7B, 4 small layers", "tiny-olmo3.json", True
    ),
    "tiny-olmoe": Preset(
        "tiny-olmoe", "olmoe", "OLMoE-1B-7B, 2 small layers", "tiny-olmoe.json", True
    ),
    "tiny-mixtral": Preset(
        "tiny-mixtral", "mixtral", "Mixtral-8x7B, 2 small layers", "tiny-mixtral.json", True
    ),
    # 4 of its 24 layers (two sliding/full periods): the bf16 model, the fp32 reference and the
    # patch's relaid expert copy fit one H200 (see its _source)
    "gpt_oss": Preset("gpt_oss", "gpt_oss", "openai/gpt-oss-20b", "gpt_oss.json", False),
    "tiny-gpt_oss": Preset(
        "tiny-gpt_oss", "gpt_oss", "gpt-oss-20b, 2 small layers", "tiny-gpt_oss.json", True
    ),
    # qwen3_5: the text model (model type qwen3_5_text) of the multimodal Qwen3.5, patched by
    # the family folder src/tilegym/transformers/qwen3_5 (flags keyed by the model type)
    "qwen3_5": Preset("qwen3_5", "qwen3_5_text", "Qwen/Qwen3.5-0.8B", "qwen3_5.json", False),
    # 4 layers: one whole layer_types period (three gated delta net layers, one full)
    "tiny-qwen3_5": Preset(
        "tiny-qwen3_5", "qwen3_5_text", "Qwen3.5-0.8B, 4 small layers", "tiny-qwen3_5.json", True
    ),
    # 4 of its 48 layers (one layer_types period): the bf16 model and the fp32 reference fit one
    # H200 (see its _source)
    "qwen3_next": Preset(
        "qwen3_next", "qwen3_next", "Qwen/Qwen3-Next-80B-A3B-Instruct", "qwen3_next.json", False
    ),
    "tiny-qwen3_next": Preset(
        "tiny-qwen3_next",
        "qwen3_next",
        "Qwen3-Next-80B-A3B, 4 small layers",
        "tiny-qwen3_next.json",
        True,
    ),
    # 8 of its 27 layers (the dense first one, 7 sparse): the bf16 model and the fp32 reference
    # fit one H200 (see its _source)
    "deepseek_v2": Preset(
        "deepseek_v2", "deepseek_v2", "deepseek-ai/DeepSeek-V2-Lite", "deepseek_v2.json", False
    ),
    "tiny-deepseek_v2": Preset(
        "tiny-deepseek_v2",
        "deepseek_v2",
        "DeepSeek-V2-Lite, 2 small layers",
        "tiny-deepseek_v2.json",
        True,
    ),
    # 4 of its 61 layers and 32 of its 256 routed experts: the bf16 model and the fp32
    # reference fit one H200 (see its _source)
    "deepseek_v3": Preset(
        "deepseek_v3", "deepseek_v3", "deepseek-ai/DeepSeek-V3", "deepseek_v3.json", False
    ),
    "tiny-deepseek_v3": Preset(
        "tiny-deepseek_v3",
        "deepseek_v3",
        "DeepSeek-V3, 2 small layers",
        "tiny-deepseek_v3.json",
        True,
    ),
}


def config_dict(preset: Preset) -> dict[str, Any]:
    """The bundled config as a plain dict, without our ``_``-prefixed annotations."""
    text = resources.files(__package__).joinpath("configs", preset.config_file).read_text()
    return {k: v for k, v in json.loads(text).items() if not k.startswith("_")}
