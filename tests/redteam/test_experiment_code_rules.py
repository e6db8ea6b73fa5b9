"""Red team, finding b: code an experiment may change runs inside the measuring process. Each
spelling of "reach the judge" the review found (and its near variants) is a scope finding."""

from __future__ import annotations

import pytest
from tilegym_hooks.scope_rules import Change, scope_findings

MODELING = "src/tilegym/transformers/qwen3/modeling_qwen3.py"
KERNEL = "src/tilegym/transformers/qwen3/kernels/rms_norm.py"
PATCH = "modeling/transformers/src/tilegym_hf_bench/tilegym_patch.py"
MONKEY = "src/tilegym/transformers/monkey_patch.py"

CLEAN_MODELING = b"""\
import inspect

import torch

from tilegym.ops import rms_norm as _ops
from tilegym.transformers.qwen3.kernels import rms_norm


def forward(self, x):
    params = inspect.signature(self.forward).parameters
    return torch.stack([_ops.rms_norm(x, self.weight)]) if params else rms_norm.run(x)
"""


def _codes(path: str, head: bytes, base: bytes | None = None) -> list[str]:
    return [f"{f.code} {f.message}" for f in scope_findings("qwen3", [Change(path, base, head)])]


def test_clean_experiment_code_passes():
    assert _codes(MODELING, CLEAN_MODELING) == []


ATTACKS = [
    (
        "rebind the classifier",
        "from tilegym_hf_bench.profiling.classify import KernelClassifier\n"
        "KernelClassifier.is_cutile = lambda self, name: True\n",
        "SCOPE010",
    ),
    (
        "widen the tolerance",
        "import tilegym_hf_bench.correctness as c\nc.REL_ERR_FACTOR = 100\n",
        "SCOPE010",
    ),
    ("reach the bot", "from tilegym_bot import policy\n", "SCOPE010"),
    ("import machinery", "import importlib\nimportlib.import_module('tilegym_bot')\n", "SCOPE011"),
    ("dunder import", "m = __import__('tilegym_hf_bench')\n", "SCOPE013"),
    ("module table", "import sys\nsys.modules['tilegym_hf_bench'].x = 1\n", "SCOPE011"),
    ("module table via torch", "import torch\nm = torch.sys.modules\n", "SCOPE013"),
    ("exec", "exec('import tilegym_bot')\n", "SCOPE013"),
    ("eval", "x = eval('1')\n", "SCOPE013"),
    ("builtins", "import builtins\n", "SCOPE011"),
    ("builtins by name", "b = __builtins__\n", "SCOPE013"),
    ("frames", "import inspect\nf = inspect.currentframe().f_back.f_globals\n", "SCOPE013"),
    ("garbage collector", "import gc\nobjs = gc.get_objects()\n", "SCOPE011"),
    ("setattr on torch", "import torch\nsetattr(torch, 'matmul', None)\n", "SCOPE014"),
    ("rebind an op", "from tilegym.ops import gemm\ngemm.linear = print\n", "SCOPE014"),
    ("triton kernel", "import triton\n", "SCOPE012"),
    ("triton language", "import triton.language as tl\n", "SCOPE012"),
    ("cupy", "from cupy import RawKernel\n", "SCOPE012"),
    ("inline CUDA", "from torch.utils.cpp_extension import load_inline\n", "SCOPE012"),
    ("numba", "from numba import cuda\n", "SCOPE012"),
]


@pytest.mark.parametrize("path", [MODELING, KERNEL])
@pytest.mark.parametrize("source, code", [a[1:] for a in ATTACKS], ids=[a[0] for a in ATTACKS])
def test_reaching_the_judge_is_a_finding(path, source, code):
    found = _codes(path, source.encode())
    assert found and found[0].startswith(code), found


def test_patch_flags_must_be_literals():
    base = (
        b'MODEL_PATCH_KWARGS = {\n    "qwen3": {"rope": True},\n    "llama": {"rope": True},\n}\n'
    )
    expression = base.replace(
        b'"qwen3": {"rope": True}',
        b'"qwen3": {"rope": __import__("tilegym_hf_bench").correctness.patch()}',
    )
    found = _codes(PATCH, expression, base)
    assert found == [
        'SCOPE003 MODEL_PATCH_KWARGS["qwen3"] must be a literal (flags as data: '
        "no names, calls or expressions)"
    ]
    literal = base.replace(b'"qwen3": {"rope": True}', b'"qwen3": {"rope": False, "attn": True}')
    assert _codes(PATCH, literal, base) == []


def test_the_patch_function_body_follows_the_same_rules():
    base = (
        b"import importlib\n\n\ndef _apply():\n    return importlib\n\n\n"
        b"def apply_tilegym_kernel_to_qwen3(model=None):\n    return _apply()\n"
    )
    head = base.replace(
        b"    return _apply()\n",
        b"    import tilegym_hf_bench.correctness as c\n    c.REL_ERR_FLOOR = 1.0\n"
        b"    return _apply()\n",
    )
    found = _codes(MONKEY, head, base)
    assert [f.split()[0] for f in found] == ["SCOPE010", "SCOPE014"]
    # main's own use of importlib outside the experiment's function is not the experiment's
    assert _codes(MONKEY, base, base) == []
