"""Shared entry points: two families' Definitions pair with Solutions naming one function outside
both family folders, with the family's constants in ``spec.entry_kwargs``. The validator, the
AOT gate and parity accept that, and still refuse a missing entry point, an entry point that
cannot take the Definition's tensors, and ``entry_kwargs`` that do not match its keywords."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from inventory_helpers import DEFINITION, SOLUTION, codes_of, make_tree, write_json

from tilegym.kernel_inventory.check import check_paths
from tilegym.kernel_inventory.compile import plan_solution, toolchain_problem
from tilegym.kernel_inventory.inventory import load
from tilegym.kernel_inventory.parity import parity_paths

SHARED = "src/tilegym/ops/entry/act.py"
SHARED_SOURCE = """import torch


def silu_and_mul(gate, up, *, scale):
    return torch.nn.functional.silu(gate) * up * scale


def aot_signatures(definition, *, scale):
    raise ValueError(f"asked for {definition.name} at I={definition.axes['I'].value}, {scale=}")
"""


def _solution(model_key: str, entry_kwargs: dict | None = None, function: str = "silu_and_mul"):
    solution = copy.deepcopy(SOLUTION)
    solution["name"] = f"{model_key}_silu_and_mul_cutile"
    solution["definition"] = f"{model_key}_silu_and_mul"
    spec = solution["spec"]
    spec["entry_point"] = f"{SHARED}::{function}"
    if entry_kwargs is not None:
        spec["entry_kwargs"] = entry_kwargs
    solution["sources"] = [{"path": SHARED}]
    return solution


def _family(root: Path, model_key: str, solution: dict, inputs: dict | None = None) -> Path:
    """``model_key``'s Definition (own name, own tags) and Solution in its family folder."""
    definition = copy.deepcopy(DEFINITION)
    definition["name"] = f"{model_key}_silu_and_mul"
    definition["tags"] = [f"model:{model_key}", "stage:prefill", "status:verified"]
    if inputs is not None:
        definition["inputs"] = inputs
        names = ", ".join(inputs)
        definition["reference"] = definition["reference"].replace("run(gate, up)", f"run({names})")
    base = root / "src" / "tilegym" / "transformers" / model_key
    write_json(base / "kernel_definitions" / f"{model_key}_silu_and_mul.json", definition)
    return write_json(base / "kernel_solutions" / f"{model_key}_silu_and_mul.json", solution)


def _tree(root: Path, source: str = SHARED_SOURCE, **solutions: dict) -> Path:
    make_tree(root)  # qwen3's own pair (a family-local kernel) beside the shared ones
    (root / "src/tilegym/transformers/qwen3/kernel_solutions/qwen3_silu_and_mul.json").unlink()
    (root / "src/tilegym/transformers/qwen3/kernel_definitions/qwen3_silu_and_mul.json").unlink()
    shared = root / SHARED
    shared.parent.mkdir(parents=True, exist_ok=True)
    shared.write_text(source, encoding="utf-8")
    for model_key, solution in solutions.items():
        _family(root, model_key, solution)
    return root


def test_two_families_share_one_entry_point(tmp_path):
    root = _tree(
        tmp_path, llama=_solution("llama", {"scale": 1.0}), qwen3=_solution("qwen3", {"scale": 1})
    )
    assert check_paths([], root) == []


def test_missing_shared_entry_point_is_refused(tmp_path):
    root = _tree(tmp_path, llama=_solution("llama", {"scale": 1.0}, function="gelu_and_mul"))
    findings = check_paths([], root)
    assert codes_of(findings) == ["INV043"]
    (root / SHARED).unlink()
    assert codes_of(check_paths([], root)) == ["INV041"]


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("def silu_and_mul(gate, *, scale):\n    pass\n", "takes (gate) positionally"),
        ("def silu_and_mul(gate, up, out, *, scale):\n    pass\n", "takes (gate, up, out)"),
        ("def silu_and_mul(*, scale):\n    pass\n", "takes () positionally"),
    ],
)
def test_entry_point_that_cannot_take_the_inputs_is_refused(tmp_path, source, needle):
    root = _tree(tmp_path, source, llama=_solution("llama", {"scale": 1.0}))
    findings = check_paths([], root)
    assert codes_of(findings) == ["INV047"]
    assert needle in findings[0].message and "(gate, up)" in findings[0].message


@pytest.mark.parametrize(
    "source",
    [
        "def silu_and_mul(gate, up, bias=None, *, scale):\n    pass\n",  # optional extra
        "def silu_and_mul(*tensors, scale):\n    pass\n",
        "def silu_and_mul(x, w, *, scale, eps=1e-6):\n    pass\n",  # other names, a default
    ],
)
def test_entry_point_taking_the_inputs_under_any_names_is_accepted(tmp_path, source):
    root = _tree(tmp_path, source, llama=_solution("llama", {"scale": 1.0}))
    assert check_paths([], root) == []


def test_destination_passing_counts_the_outputs(tmp_path):
    solution = _solution("llama", {"scale": 1.0})
    solution["spec"]["destination_passing_style"] = True
    root = _tree(tmp_path, llama=solution)
    assert codes_of(check_paths([], root)) == ["INV047"]
    source = "def silu_and_mul(gate, up, out, *, scale):\n    pass\n"
    assert check_paths([], _tree(tmp_path / "dps", source, llama=solution)) == []


@pytest.mark.parametrize(
    ("entry_kwargs", "needle"),
    [
        (None, "needs keyword argument(s) scale"),
        ({}, "needs keyword argument(s) scale"),
        ({"scale": 1.0, "eps": 1e-6}, "entry_kwargs eps: not a keyword-only parameter"),
        ({"scale": 1.0, "up": 2.0}, "entry_kwargs up: not a keyword-only parameter"),
    ],
)
def test_entry_kwargs_must_match_the_keyword_only_parameters(tmp_path, entry_kwargs, needle):
    root = _tree(tmp_path, llama=_solution("llama", entry_kwargs))
    findings = check_paths([], root)
    assert codes_of(findings) == ["INV048"]
    assert needle in findings[0].message


def test_entry_kwargs_is_a_flat_object_of_scalars(tmp_path):
    root = _tree(tmp_path, llama=_solution("llama", {"scale": [1.0]}))
    assert codes_of(check_paths([], root)) == ["INV013"]
    root = _tree(tmp_path / "b", llama=_solution("llama", {"not an identifier": 1.0}))
    assert codes_of(check_paths([], root))[0].startswith("INV01")


def test_parity_binds_entry_kwargs(tmp_path):
    root = _tree(tmp_path, llama=_solution("llama", {"scale": 1.0}))
    assert parity_paths([], root, device="cpu", n_shapes=2) == []
    root = _tree(tmp_path / "wrong", llama=_solution("llama", {"scale": 2.0}))
    assert codes_of(parity_paths([], root, device="cpu", n_shapes=2)) == ["INV071", "INV071"]


@pytest.mark.skipif(toolchain_problem() is not None, reason="no cuTile compile toolchain")
def test_compile_gate_passes_the_definition_and_entry_kwargs(tmp_path):
    root = _tree(
        tmp_path, llama=_solution("llama", {"scale": 0.5}), qwen3=_solution("qwen3", {"scale": 1})
    )
    for model_key in ("llama", "qwen3"):
        path = root / f"src/tilegym/transformers/{model_key}/kernel_solutions"
        loaded = load(path / f"{model_key}_silu_and_mul.json", root)
        findings, jobs = plan_solution(loaded, root)
        assert jobs == [] and codes_of(findings) == ["INV062"]
        scale = 0.5 if model_key == "llama" else 1
        assert f"asked for {model_key}_silu_and_mul at I=96, scale={scale}" in findings[0].message


@pytest.mark.skipif(toolchain_problem() is not None, reason="no cuTile compile toolchain")
def test_compile_gate_needs_the_definition_of_a_shared_entry_point(tmp_path):
    root = _tree(tmp_path, llama=_solution("llama", {"scale": 0.5}))
    base = root / "src/tilegym/transformers/llama"
    (base / "kernel_definitions/llama_silu_and_mul.json").write_text("{}\n")
    loaded = load(base / "kernel_solutions/llama_silu_and_mul.json", root)
    findings, jobs = plan_solution(loaded, root)
    assert jobs == [] and codes_of(findings) == ["INV062"]
    assert "needs the Solution's Definition" in findings[0].message


def test_the_repository_inventory_shares_entry_points():
    """Every family Solution of a shared op names ``src/tilegym/ops/entry/``; the family
    folders keep only their own kernels (issue 44)."""
    root = Path(__file__).resolve().parents[2]
    solutions = sorted(root.glob("src/tilegym/transformers/*/kernel_solutions/*.json"))
    entries = {p: json.loads(p.read_text())["spec"]["entry_point"] for p in solutions}
    local = sorted({e.split("::")[0] for e in entries.values() if "/transformers/" in e})
    assert local == [
        "src/tilegym/transformers/gemma3/kernels/gelu_tanh_and_mul.py",
        "src/tilegym/transformers/gemma3/kernels/linear_gate_up_gelu.py",
        "src/tilegym/transformers/gemma3/kernels/norm_add.py",
        "src/tilegym/transformers/granite/kernels/add_rms_norm.py",
        "src/tilegym/transformers/granite/kernels/linear_residual.py",
    ]
    kernel_files = sorted(
        p.relative_to(root).as_posix()
        for p in root.glob("src/tilegym/transformers/*/kernels/*.py")
        if p.name != "__init__.py"
    )
    assert kernel_files == local  # no wrapper left that no Solution names


@pytest.mark.skipif(toolchain_problem() is not None, reason="no cuTile compile toolchain")
def test_worker_processes_get_the_definition_and_entry_kwargs():
    """A compile worker re-imports the shared module and asks it again with the same
    Definition and entry_kwargs (here: a kernel name it does not declare, so nothing compiles)."""
    from tilegym.kernel_inventory.compile import _compile_in_worker

    root = Path(__file__).resolve().parents[2]
    entry = root / "src/tilegym/ops/entry/qk_norm_rope.py"
    definition = (
        root / "src/tilegym/transformers/gemma3/kernel_definitions/gemma3_qk_norm_rope.json"
    )
    kwargs = {"eps": 1e-6, "unit_offset": True}
    error, _ = _compile_in_worker(str(entry), str(root), "nope", "sm_90", str(definition), kwargs)
    assert error == "worker did not find nope in aot_signatures()"
    error, _ = _compile_in_worker(str(entry), str(root), "nope", "sm_90", None, kwargs)
    assert "could not re-import" in error and "needs the Solution's Definition" in error
