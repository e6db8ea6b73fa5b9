"""Runtime parity logic on the CPU with plain torch functions standing in for kernels."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
import torch
from inventory_helpers import DEFINITION, PERMALINK, SOLUTION, make_tree

from tilegym.kernel_inventory.models import Definition
from tilegym.kernel_inventory.parity import (
    check_parity,
    load_reference,
    make_inputs,
    parity_paths,
    sample_shapes,
)

SILU_AND_MUL = Definition.from_dict(DEFINITION)


def _codes(issues):
    return sorted({issue.code for issue in issues})


def _two_outputs(extra: dict | None = None) -> Definition:
    data = copy.deepcopy(DEFINITION)
    data["name"] = "scale_and_shift"
    data["axes"] = {"T": {"type": "var"}, "H": {"type": "const", "value": 40}}
    data["inputs"] = {"x": {"shape": ["T", "H"], "dtype": "float32"}}
    data["outputs"] = {
        "doubled": {"shape": ["T", "H"], "dtype": "float32"},
        "shifted": {"shape": ["T", "H"], "dtype": "float32"},
    }
    data["reference"] = f"# Source: {PERMALINK}\ndef run(x):\n    return x * 2, x + 1\n"
    data.update(extra or {})
    return Definition.from_dict(data)


def correct(gate, up):
    return torch.nn.functional.silu(gate) * up


def test_correct_solution_passes():
    assert check_parity(SILU_AND_MUL, correct, device="cpu") == []
    assert check_parity(_two_outputs(), lambda x: (x * 2, x + 1), device="cpu") == []


def test_zeros_fail():
    issues = check_parity(SILU_AND_MUL, lambda gate, up: torch.zeros_like(gate), device="cpu")
    assert _codes(issues) == ["INV071"]
    assert len(issues) == 4  # every shape


def test_ignoring_an_input_fails():
    ignores_up = lambda gate, up: torch.nn.functional.silu(gate) * gate  # noqa: E731
    assert _codes(check_parity(SILU_AND_MUL, ignores_up, device="cpu")) == ["INV071"]


def test_swapped_outputs_fail():
    issues = check_parity(_two_outputs(), lambda x: (x + 1, x * 2), device="cpu")
    assert _codes(issues) == ["INV071"]
    assert {"'doubled'" in i.message or "'shifted'" in i.message for i in issues} == {True}


def test_low_precision_solution_within_tolerance_passes_but_fp32_bar_is_strict():
    lossy = lambda x: ((x.bfloat16() * 2).float(), x + 1)  # noqa: E731
    assert _codes(check_parity(_two_outputs(), lossy, device="cpu")) == ["INV071"]
    assert check_parity(_two_outputs(), lossy, device="cpu", tolerances={"float32": 1e-2}) == []


def test_an_outputs_own_tolerance_replaces_its_dtypes():
    lossy = lambda x: (x.float() * 2 * 1.003, x.float() + 1)  # noqa: E731
    relaxed = _two_outputs()
    data = copy.deepcopy(DEFINITION)
    data.update(name=relaxed.name, axes={"T": {"type": "var"}, "H": {"type": "const", "value": 40}})
    data["inputs"] = {"x": {"shape": ["T", "H"], "dtype": "bfloat16"}}
    data["outputs"] = {
        "doubled": {"shape": ["T", "H"], "dtype": "float32", "tolerance": 1e-2},
        "shifted": {"shape": ["T", "H"], "dtype": "float32"},
    }
    data["reference"] = relaxed.reference
    relaxed = Definition.from_dict(data)
    assert check_parity(relaxed, lossy, device="cpu") == []
    strict = copy.deepcopy(data)
    strict["outputs"]["doubled"]["tolerance"] = 1e-5
    issues = check_parity(Definition.from_dict(strict), lossy, device="cpu")
    assert _codes(issues) == ["INV071"]
    assert all("'doubled'" in i.message and "tolerance 1e-05" in i.message for i in issues)


def test_modified_input_fails_unless_declared():
    def in_place(gate, up):
        return gate.copy_(torch.nn.functional.silu(gate) * up)

    assert "INV073" in _codes(check_parity(SILU_AND_MUL, in_place, device="cpu"))
    data = copy.deepcopy(DEFINITION)
    data["tags"].append("mutates:gate")
    assert check_parity(Definition.from_dict(data), in_place, device="cpu") == []


def test_a_reference_that_updates_its_input_does_not_change_the_solutions_input():
    """A cache-updating reference (``state.copy_``) must work on its own copy.

    On a GPU the reference runs in float32, so a float32 input is not upcast; a shared tensor
    let the reference's update reach the Solution, which then stepped from the new state.
    """
    data = copy.deepcopy(DEFINITION)
    data["name"] = "accumulate"
    data["axes"] = {"T": {"type": "var"}, "H": {"type": "const", "value": 8}}
    data["inputs"] = {
        "x": {"shape": ["T", "H"], "dtype": "float32"},
        "state": {"shape": ["T", "H"], "dtype": "float32"},
    }
    data["outputs"] = {"new_state": {"shape": ["T", "H"], "dtype": "float32"}}
    data["reference"] = (
        f"# Source: {PERMALINK}\n"
        "def run(x, state):\n    s = state + x\n    state.copy_(s)\n    return s\n"
    )
    data["tags"] = ["mutates:state"]
    definition = Definition.from_dict(data)

    def step(x, state):
        return state.add_(x)

    for ref_dtype in (torch.float32, torch.float64):
        assert check_parity(definition, step, device="cpu", ref_dtype=ref_dtype) == []


def test_destination_passing_style_poisons_outputs():
    def writes_all(gate, up, out):
        out.copy_(torch.nn.functional.silu(gate) * up)

    def writes_half(gate, up, out):
        rows = out.shape[0] // 2 + 1
        out[:rows].copy_((torch.nn.functional.silu(gate) * up)[:rows])

    assert (
        check_parity(SILU_AND_MUL, writes_all, device="cpu", destination_passing_style=True) == []
    )
    issues = check_parity(SILU_AND_MUL, writes_half, device="cpu", destination_passing_style=True)
    assert "INV072" in _codes(issues)


def test_output_form_is_checked():
    assert _codes(check_parity(SILU_AND_MUL, lambda g, u: correct(g, u).float(), device="cpu")) == [
        "INV074"
    ]
    assert _codes(check_parity(SILU_AND_MUL, lambda g, u: correct(g, u)[:1], device="cpu")) == [
        "INV074"
    ]
    assert _codes(check_parity(_two_outputs(), lambda x: x * 2, device="cpu")) == ["INV074"]


def test_nan_output_fails():
    def nan_corner(gate, up):
        out = correct(gate, up)
        out[0, 0] = float("nan")
        return out

    assert _codes(check_parity(SILU_AND_MUL, nan_corner, device="cpu")) == ["INV072"]


def test_raising_solution_and_reference():
    def boom(gate, up):
        raise RuntimeError("kernel launch failed\nsecond line")

    issues = check_parity(SILU_AND_MUL, boom, device="cpu")
    assert _codes(issues) == ["INV070"]
    assert "kernel launch failed" in issues[0].message
    data = copy.deepcopy(DEFINITION)
    data["reference"] = f"# Source: {PERMALINK}\ndef run(gate, up):\n    return gate.nope()\n"
    assert _codes(check_parity(Definition.from_dict(data), correct, device="cpu")) == ["INV075"]


def test_integer_outputs_are_exact():
    data = copy.deepcopy(DEFINITION)
    data["inputs"] = {"ids": {"shape": ["T"], "dtype": "int64"}}
    data["outputs"] = {"doubled": {"shape": ["T"], "dtype": "int64"}}
    data["axes"] = {"T": {"type": "var"}}
    data["reference"] = f"# Source: {PERMALINK}\ndef run(ids):\n    return ids * 2\n"
    definition = Definition.from_dict(data)
    assert check_parity(definition, lambda ids: ids * 2, device="cpu") == []
    assert _codes(check_parity(definition, lambda ids: ids * 2 + (ids == 3), device="cpu")) == [
        "INV071"
    ]


def test_scalar_inputs_and_constraints():
    data = copy.deepcopy(DEFINITION)
    data["inputs"]["scale"] = {"shape": None, "dtype": "float32"}
    data["constraints"] = ["T % 3 == 0", "T <= 300"]
    data["reference"] = (
        f"# Source: {PERMALINK}\nimport torch\n\ndef run(gate, up, scale):\n"
        "    return torch.nn.functional.silu(gate) * up * scale\n"
    )
    definition = Definition.from_dict(data)
    seen = []

    def solution(gate, up, scale):
        seen.append(gate.shape[0])
        return correct(gate, up) * scale

    assert check_parity(definition, solution, device="cpu") == []
    assert len(seen) == 4 and all(t % 3 == 0 and t <= 300 for t in seen)


def test_shape_sampling_prefers_odd_sizes_and_respects_constraints():
    shapes = sample_shapes(SILU_AND_MUL, 5, random.Random(1))
    assert len(shapes) == 5
    assert all(s["I"] == 96 for s in shapes)
    assert shapes[0]["T"] % 2 == 1 and shapes[0]["T"] > 2
    assert len({s["T"] for s in shapes}) == 5
    impossible = copy.deepcopy(DEFINITION)
    impossible["constraints"] = ["T < 0"]
    definition = Definition.from_dict(impossible)
    assert _codes(check_parity(definition, correct, device="cpu")) == ["INV076"]


def test_unsupported_dtype_is_a_finding():
    data = copy.deepcopy(DEFINITION)
    data["inputs"]["gate"]["dtype"] = "float4_e2m1"
    assert _codes(check_parity(Definition.from_dict(data), correct, device="cpu")) == ["INV077"]


def test_parity_over_inventory_files(tmp_path):
    make_tree(tmp_path)
    assert parity_paths([], tmp_path, device="cpu") == []
    wrong = "import torch\n\ndef silu_and_mul(gate, up):\n    return torch.zeros_like(gate)\n"
    make_tree(tmp_path, kernel_source=wrong)
    findings = parity_paths([], tmp_path, device="cpu", n_shapes=2)
    assert [f.code for f in findings] == ["INV071", "INV071"]
    assert findings[0].path.endswith("kernel_solutions/qwen3_silu_and_mul.json")
    solution = copy.deepcopy(SOLUTION)
    solution["spec"]["entry_point"] = solution["spec"]["entry_point"].replace("silu", "gelu")
    make_tree(tmp_path, solution=solution)
    assert [f.code for f in parity_paths([], tmp_path, device="cpu")] == ["INV070"]


@pytest.mark.parametrize("seed", [0, 1])
def test_fresh_inputs_per_seed(seed):
    values = []
    check_parity(SILU_AND_MUL, lambda g, u: values.append(g.sum()) or correct(g, u), seed=seed)
    assert len(values) == 4 and len({float(v) for v in values}) == 4


CUTILE_KERNEL = """import cuda.tile as ct
import torch
from cuda.tile.compilation import ArrayConstraint, CallingConvention, KernelSignature

TILE_M, TILE_N = 8, 128


@ct.kernel
def silu_mul_kernel(gate, up, out, TM: ct.Constant[int], TN: ct.Constant[int]):
    i = ct.bid(0)
    j = ct.bid(1)
    zero = ct.PaddingMode.ZERO
    g = ct.load(gate, (i, j), (TM, TN), padding_mode=zero).astype(ct.float32)
    u = ct.load(GATE_OR_UP, (i, j), (TM, TN), padding_mode=zero).astype(ct.float32)
    ct.store(out, (i, j), (g / (1.0 + ct.exp(-g)) * u).astype(out.dtype))


def silu_and_mul(gate, up):
    out = torch.empty_like(gate)
    grid = ((gate.shape[0] + TILE_M - 1) // TILE_M, (gate.shape[1] + TILE_N - 1) // TILE_N, 1)
    ct.launch(torch.cuda.current_stream(), grid, silu_mul_kernel, (gate, up, out, TILE_M, TILE_N))
    return out


def aot_signatures():
    array = ArrayConstraint(
        ct.bfloat16, 2, index_dtype=ct.int32, stride_lower_bound_incl=0,
        alias_groups=(), may_alias_internally=False,
    )
    signature = KernelSignature(
        [array, array, array, TILE_M, TILE_N], CallingConvention.cutile_python_v1()
    )
    return {silu_mul_kernel: [signature]}
"""


@pytest.mark.gpu
def test_real_cutile_kernel_parity_on_gpu(tmp_path):
    good = tmp_path / "good"
    make_tree(good, kernel_source=CUTILE_KERNEL.replace("GATE_OR_UP", "up"))
    assert parity_paths([], good, device="cuda") == []
    broken = tmp_path / "broken"
    make_tree(broken, kernel_source=CUTILE_KERNEL.replace("GATE_OR_UP", "gate"))
    findings = parity_paths([], broken, device="cuda")
    assert findings and {f.code for f in findings} == {"INV071"}


def test_large_const_only_tensors_do_not_block_sampling():
    data = copy.deepcopy(DEFINITION)
    data["axes"] = {
        "T": {"type": "var"},
        "V": {"type": "const", "value": 50},
        "H": {"type": "const", "value": 40},
    }
    data["inputs"] = {
        "hidden": {"shape": ["T", "H"], "dtype": "float32"},
        "weight": {"shape": ["V", "H"], "dtype": "float32"},
    }
    data["outputs"] = {"logits": {"shape": ["T", "V"], "dtype": "float32"}}
    data["reference"] = (
        f"# Source: {PERMALINK}\ndef run(hidden, weight):\n    return hidden @ weight.T\n"
    )
    shapes = sample_shapes(Definition.from_dict(data), 3, random.Random(0), max_elements=1000)
    assert len(shapes) == 3  # the 2000-element weight is fixed; only T is capped
    assert all(s["T"] * 50 <= 1000 and s["T"] * 40 <= 1000 for s in shapes)


MIXTRAL_GATE_UP = (
    Path(__file__).resolve().parents[2]
    / "src/tilegym/transformers/mixtral/kernel_definitions/mixtral_experts_gate_up_silu.json"
)


def _expert_ids(index_of: str | None) -> Definition:
    data = copy.deepcopy(DEFINITION)
    data["axes"] = {"T": {"type": "var"}, "K": {"type": "const", "value": 2}}
    data["axes"]["E"] = {"type": "const", "value": 8}
    data["inputs"] = {"ids": {"shape": ["T", "K"], "dtype": "int32"}}
    if index_of is not None:
        data["inputs"]["ids"]["index_of"] = index_of
    data["outputs"] = {"out": {"shape": ["T", "K"], "dtype": "int32"}}
    data["reference"] = f"# Source: {PERMALINK}\ndef run(ids):\n    return ids\n"
    return Definition.from_dict(data)


def _drawn_ids(definition: Definition) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    binding = {"T": 257, "K": 2, "E": 8}
    draws = [make_inputs(definition, binding, "cpu", generator)["ids"] for _ in range(50)]
    return torch.cat([d.flatten() for d in draws])


def test_index_of_draws_valid_indices_of_its_axis_and_others_keep_the_wide_range():
    ids = _drawn_ids(_expert_ids("E"))
    assert ids.dtype == torch.int32
    assert set(ids.tolist()) == set(range(8))  # every expert, none past E
    plain = _drawn_ids(_expert_ids(None))
    assert set(plain.tolist()) == set(range(16))


def test_mixtral_reference_runs_on_parity_inputs():
    """Mixtral's 8 experts: ids drawn in [0, 16) made its reference index past the weights."""
    data = json.loads(MIXTRAL_GATE_UP.read_text(encoding="utf-8"))
    assert data["axes"]["E"]["value"] == 8
    data["axes"]["H"]["value"] = 24  # the real 4096 x 28672 experts are too big for a CPU test
    data["axes"]["I"]["value"] = 16
    data["axes"]["I2"]["value"] = 32
    definition = Definition.from_dict(data)
    reference = load_reference(definition)
    issues = check_parity(definition, reference, device="cpu", n_shapes=3)
    assert issues == []
