"""Semantic rules: each planted violation gives its own code at the key's line."""

from __future__ import annotations

import copy

import pytest
from inventory_helpers import DEFINITION, KERNEL_PATH, PERMALINK, SOLUTION, codes_of, make_tree

from tilegym.kernel_inventory.check import check_paths
from tilegym.kernel_inventory.semantics import constraint_problem, repo_relative_problem


def _definition(**changes):
    definition = copy.deepcopy(DEFINITION)
    definition.update(changes)
    return definition


def _run_check(tmp_path, definition=None, solution=None, **kwargs):
    definition_path, solution_path = make_tree(tmp_path, definition, solution, **kwargs)
    return check_paths([definition_path], tmp_path)


def _at_key(tmp_path, key: str, text: str) -> str:
    """The finding line expected at the first line of the written Definition naming ``key``."""
    path = "src/tilegym/transformers/qwen3/kernel_definitions/qwen3_silu_and_mul.json"
    rows = (tmp_path / path).read_text().splitlines()
    line = next(i for i, row in enumerate(rows, 1) if f'"{key}"' in row)
    return f"{path}:{line}: {text}"


BODY = "import torch\n\ndef run(gate, up):\n    return gate * up\n"


@pytest.mark.parametrize(
    ("reference", "codes"),
    [
        (BODY, ["INV031"]),
        ("\n" + f"# Source: {PERMALINK}\n" + BODY, ["INV031"]),
        (
            f"# Source: {PERMALINK.replace('0123456789abcdef' * 2 + '01234567', 'main')}\n" + BODY,
            ["INV032"],
        ),
        (f"# Source: {PERMALINK.replace('#L50-L52', '#L52-L50')}\n" + BODY, ["INV032"]),
        (f"# Source: {PERMALINK}\n" + BODY + "# Source: https://example.com/x\n", ["INV032"]),
        (f"# Source: {PERMALINK}\nimport torch\n\ndef run(gate, up)\n    return 1\n", ["INV030"]),
        (f"# Source: {PERMALINK}\nimport torch\n", ["INV033"]),
        (
            f"# Source: {PERMALINK}\nclass K:\n    def run(self, gate, up):\n        pass\n",
            ["INV033"],
        ),
        (f"# Source: {PERMALINK}\ndef run(up, gate):\n    return up\n", ["INV034"]),
        (f"# Source: {PERMALINK}\ndef run(gate):\n    return gate\n", ["INV034"]),
        (f"# Source: {PERMALINK}\ndef run(gate, up, *rest):\n    return gate\n", ["INV034"]),
        (f"# Source: {PERMALINK}\n# Source: {PERMALINK}\n" + BODY, []),
    ],
)
def test_reference_rules(tmp_path, reference, codes):
    findings = _run_check(tmp_path, _definition(reference=reference))
    assert codes_of(findings) == codes
    text = tmp_path / "src/tilegym/transformers/qwen3/kernel_definitions/qwen3_silu_and_mul.json"
    reference_line = next(
        i for i, line in enumerate(text.read_text().splitlines(), 1) if '"reference"' in line
    )
    assert all(f.line == reference_line for f in findings)


def test_definition_rules(tmp_path):
    definition = _definition(
        name="other_name",
        constraints=["T % 2 == 0", "T >", "Z < 3", "len(T) > 1"],
        tags=["model:qwen3", "verified", "mutates:nothing"],
    )
    definition["inputs"]["gate"]["shape"] = ["T", "H"]
    definition["outputs"]["up"] = {"shape": ["T", "I"], "dtype": "bfloat16"}
    findings = _run_check(tmp_path, definition)
    assert codes_of(findings) == [
        "INV020",
        "INV035",
        "INV036",
        "INV036",
        "INV036",
        "INV037",
        "INV038",
        "INV039",
    ]
    by_code = {f.code: f for f in findings}
    assert "'H'" in by_code["INV035"].message
    assert by_code["INV020"].line == 2  # line 1 is "{", "name" comes first


def test_scalar_inputs_have_no_shape_axes(tmp_path):
    definition = _definition()
    definition["inputs"]["eps"] = {"shape": None, "dtype": "float32"}
    definition["reference"] = f"# Source: {PERMALINK}\ndef run(gate, up, eps):\n    return gate\n"
    kernel = "def silu_and_mul(gate, up, eps):\n    return gate\n"  # takes the scalar too
    assert _run_check(tmp_path, definition, kernel_source=kernel) == []


def test_solution_rules(tmp_path):
    solution = copy.deepcopy(SOLUTION)
    solution["sources"] = [
        {"path": KERNEL_PATH},
        {"path": KERNEL_PATH},
        {"path": "/etc/passwd"},
        {"path": "src/../../outside.py"},
        {"path": "src/missing.py"},
    ]
    solution["spec"]["entry_point"] = f"{KERNEL_PATH}::not_there"
    findings = _run_check(tmp_path, solution=solution)
    assert codes_of(findings) == ["INV040", "INV040", "INV041", "INV043", "INV046"]


def test_entry_point_must_be_a_source(tmp_path):
    solution = copy.deepcopy(SOLUTION)
    solution["spec"]["entry_point"] = "src/elsewhere.py::silu_and_mul"
    assert codes_of(_run_check(tmp_path, solution=solution)) == ["INV042"]


def test_entry_point_file_with_syntax_error(tmp_path):
    findings = _run_check(tmp_path, kernel_source="def silu_and_mul(:\n")
    assert codes_of(findings) == ["INV043"]
    assert "syntax error" in findings[0].message


def test_entry_point_nested_function_does_not_count(tmp_path):
    source = "def outer():\n    def silu_and_mul(gate, up):\n        return gate\n"
    assert codes_of(_run_check(tmp_path, kernel_source=source)) == ["INV043"]


def test_symlink_escaping_the_repository(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "k.py").write_text("def silu_and_mul(a, b):\n    return a\n")
    repo = tmp_path / "repo"
    solution = copy.deepcopy(SOLUTION)
    solution["sources"].append({"path": "src/link.py"})
    make_tree(repo, solution=solution)
    (repo / "src" / "link.py").symlink_to(outside / "k.py")
    findings = check_paths([], repo)
    assert codes_of(findings) == ["INV040"]


def test_stem_and_pairing(tmp_path):
    solution = copy.deepcopy(SOLUTION)
    solution["definition"] = "something_else"
    definition_path, solution_path = make_tree(tmp_path, solution=solution)
    assert codes_of(check_paths([solution_path], tmp_path)) == ["INV021"]
    solution_path.unlink()
    assert codes_of(check_paths([definition_path], tmp_path)) == ["INV022"]
    make_tree(tmp_path)
    definition_path.unlink()
    assert codes_of(check_paths([], tmp_path)) == ["INV023"]


def test_checking_one_file_checks_its_pair(tmp_path):
    solution = copy.deepcopy(SOLUTION)
    solution["author"] = ""
    definition_path, solution_path = make_tree(tmp_path, solution=solution)
    findings = check_paths([definition_path], tmp_path)
    assert [(f.path, f.code) for f in findings] == [
        ("src/tilegym/transformers/qwen3/kernel_solutions/qwen3_silu_and_mul.json", "INV014")
    ]


def test_constraint_and_path_helpers():
    assert constraint_problem("T % 8 == 0 and T <= 4096", {"T"}) is None
    assert constraint_problem("__import__('os')", {"T"}) is not None
    assert constraint_problem("T.bit_length() < 3", {"T"}) is not None
    assert repo_relative_problem("src/a.py") is None
    for bad in ("/abs.py", "C:/x.py", "a/../b.py", "./a.py", "a\\b.py", "a//b.py"):
        assert repo_relative_problem(bad) is not None


def test_directory_argument_checks_the_inventory_inside(tmp_path):
    definition = _definition(tags=["untagged"])
    make_tree(tmp_path, definition=definition)
    assert codes_of(check_paths([tmp_path / "src"], tmp_path)) == ["INV038"]
    empty_model = tmp_path / "src" / "tilegym" / "transformers" / "llama"
    empty_model.mkdir()
    assert check_paths([empty_model], tmp_path) == []


@pytest.mark.parametrize(
    ("index_of", "dtype", "message"),
    [
        ("X", "int32", "inputs.ids.index_of 'X' names no axis (axes: T, I, E)"),
        ("E", "float32", "inputs.ids.index_of 'E' needs an integer dtype, not float32"),
        ("E", "bool", "inputs.ids.index_of 'E' needs an integer dtype, not bool"),
    ],
)
def test_index_of_must_name_an_axis_of_an_integer_input(tmp_path, index_of, dtype, message):
    definition = _definition()
    definition["axes"]["E"] = {"type": "const", "value": 8}
    definition["inputs"]["ids"] = {"shape": ["T"], "dtype": dtype, "index_of": index_of}
    definition["reference"] = f"# Source: {PERMALINK}\ndef run(gate, up, ids):\n    return gate\n"
    kernel = "def silu_and_mul(gate, up, ids):\n    return gate\n"
    findings = _run_check(tmp_path, definition, kernel_source=kernel)
    assert [str(f) for f in findings] == [_at_key(tmp_path, "index_of", f"INV049 {message}")]


def test_index_of_on_an_integer_input_naming_an_axis_passes(tmp_path):
    definition = _definition()
    definition["axes"]["E"] = {"type": "const", "value": 8}
    definition["inputs"]["ids"] = {"shape": ["T"], "dtype": "int64", "index_of": "E"}
    definition["reference"] = f"# Source: {PERMALINK}\ndef run(gate, up, ids):\n    return gate\n"
    kernel = "def silu_and_mul(gate, up, ids):\n    return gate\n"
    assert _run_check(tmp_path, definition, kernel_source=kernel) == []


@pytest.mark.parametrize(
    ("dtype", "tolerance", "message"),
    [
        (
            "float32",
            0.05,
            "outputs.out.tolerance 0.05 is looser than the inputs allow (at most 0.02)",
        ),
        ("int32", 0.01, "outputs.out.tolerance on a int32 output (exact or unsupported)"),
    ],
)
def test_an_outputs_tolerance_is_bounded_by_its_inputs_precision(
    tmp_path, dtype, tolerance, message
):
    definition = _definition()
    definition["outputs"]["out"] = {"shape": ["T", "I"], "dtype": dtype, "tolerance": tolerance}
    findings = _run_check(tmp_path, definition)
    assert [str(f) for f in findings] == [_at_key(tmp_path, "tolerance", f"INV055 {message}")]


def test_an_fp32_output_of_bf16_inputs_may_relax_to_bf16s_tolerance(tmp_path):
    definition = _definition()
    definition["outputs"]["out"] = {"shape": ["T", "I"], "dtype": "float32", "tolerance": 1e-3}
    assert _run_check(tmp_path, definition) == []
