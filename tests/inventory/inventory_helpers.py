"""Builders for small, real inventory trees used by the kernel inventory tests."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

SHA = "0123456789abcdef0123456789abcdef01234567"
PERMALINK = (
    f"https://github.com/huggingface/transformers/blob/{SHA}/"
    "src/transformers/models/qwen3/modeling_qwen3.py#L50-L52"
)
FINDING_LINE = re.compile(r"^[^:]+:\d+: [A-Z]+\d+ .+$")

DEFINITION = {
    "name": "qwen3_silu_and_mul",
    "op_type": "silu_and_mul",
    "axes": {
        "T": {"type": "var", "description": "tokens"},
        "I": {"type": "const", "value": 96},
    },
    "inputs": {
        "gate": {"shape": ["T", "I"], "dtype": "bfloat16"},
        "up": {"shape": ["T", "I"], "dtype": "bfloat16"},
    },
    "outputs": {"out": {"shape": ["T", "I"], "dtype": "bfloat16"}},
    "reference": (
        f"# Source: {PERMALINK}\n"
        "import torch\n\n"
        "def run(gate, up):\n"
        "    return torch.nn.functional.silu(gate) * up\n"
    ),
    "tags": ["model:qwen3", "stage:prefill", "status:verified"],
}

KERNEL_PATH = "src/tilegym/transformers/qwen3/kernels/silu_and_mul.py"

SOLUTION = {
    "name": "qwen3_silu_and_mul_cutile",
    "definition": "qwen3_silu_and_mul",
    "author": "tilegym",
    "spec": {
        "language": "cuda-tile",
        "target_hardware": ["SM90", "SM100", "SM120"],
        "entry_point": f"{KERNEL_PATH}::silu_and_mul",
        "dependencies": ["torch", "cuda-tile"],
        "destination_passing_style": False,
    },
    "sources": [{"path": KERNEL_PATH}],
}

TORCH_KERNEL = """import torch


def silu_and_mul(gate, up):
    return torch.nn.functional.silu(gate) * up
"""


def model_dir(root: Path, model_key: str = "qwen3") -> Path:
    return root / "src" / "tilegym" / "transformers" / model_key


def write_json(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def make_tree(
    root: Path,
    definition: dict | None = None,
    solution: dict | None = None,
    kernel_source: str = TORCH_KERNEL,
    stem: str = "qwen3_silu_and_mul",
) -> tuple[Path, Path]:
    """A repository root with one valid (or the given) Definition/Solution pair and kernel."""
    (root / ".git").mkdir(parents=True, exist_ok=True)
    base = model_dir(root)
    definition_path = write_json(
        base / "kernel_definitions" / f"{stem}.json",
        copy.deepcopy(DEFINITION) if definition is None else definition,
    )
    solution_path = write_json(
        base / "kernel_solutions" / f"{stem}.json",
        copy.deepcopy(SOLUTION) if solution is None else solution,
    )
    kernel = root / KERNEL_PATH
    kernel.parent.mkdir(parents=True, exist_ok=True)
    kernel.write_text(kernel_source, encoding="utf-8")
    return definition_path, solution_path


def codes_of(findings) -> list[str]:
    return sorted(f.code for f in findings)
