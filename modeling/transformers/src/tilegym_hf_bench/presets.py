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
}


def config_dict(preset: Preset) -> dict[str, Any]:
    """The bundled config as a plain dict, without our ``_``-prefixed annotations."""
    text = resources.files(__package__).joinpath("configs", preset.config_file).read_text()
    return {k: v for k, v in json.loads(text).items() if not k.startswith("_")}
