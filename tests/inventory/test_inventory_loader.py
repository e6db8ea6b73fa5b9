"""Loading and schema validation: every bad file is one finding at the right line."""

from __future__ import annotations

import copy
import json
import os

import pytest
from inventory_helpers import DEFINITION, SOLUTION, codes_of, make_tree, model_dir

from tilegym.kernel_inventory.check import check_paths
from tilegym.kernel_inventory.jsonfile import MAX_BYTES, load_json_file
from tilegym.kernel_inventory.schema import load_schema


def test_valid_pair_has_no_findings(tmp_path):
    make_tree(tmp_path)
    assert check_paths([], tmp_path) == []


def test_schemas_are_package_files_with_closed_objects():
    definition = load_schema("definition")
    solution = load_schema("solution")
    assert definition["additionalProperties"] is False
    assert solution["additionalProperties"] is False
    assert solution["properties"]["spec"]["additionalProperties"] is False
    assert set(definition["$defs"]["dtype"]["enum"]) == {
        "float32",
        "float16",
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float4_e2m1",
        "int64",
        "int32",
        "int16",
        "int8",
        "bool",
    }


@pytest.mark.parametrize(
    ("raw", "code", "line"),
    [
        (b'{\n  "name": "x",\n  "op_type": \n}\n', "INV004", 4),
        (b"", "INV004", 1),
        (b'{"a": 1,\n "a": 2}', "INV005", 1),
        (b'{"a": NaN}', "INV004", 1),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "INV003", 3),
        (b'{"name": "\xff\xfe"}', "INV003", 1),
    ],
)
def test_malformed_files(tmp_path, raw, code, line):
    (tmp_path / ".git").mkdir()
    path = model_dir(tmp_path) / "kernel_definitions" / "broken.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(raw)
    findings = [f for f in check_paths([path], tmp_path) if f.code != "INV022"]
    assert [(f.code, f.line) for f in findings] == [(code, line)]


def test_missing_and_huge_files(tmp_path):
    missing = load_json_file(tmp_path / "nope.json")
    assert missing.code == "INV001"
    huge = tmp_path / "huge.json"
    huge.write_bytes(b"[" + b"0," * (MAX_BYTES // 2) + b"0]")
    assert load_json_file(huge).code == "INV002"
    assert load_json_file(tmp_path).code == "INV001"  # a directory


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of mode bits")
def test_unreadable_file(tmp_path):
    path = tmp_path / "secret.json"
    path.write_text("{}")
    path.chmod(0)
    try:
        assert load_json_file(path).code == "INV001"
    finally:
        path.chmod(0o600)


def _lines_of(findings):
    return {(f.code, f.line) for f in findings}


def test_schema_errors_point_at_the_key_line(tmp_path):
    definition = copy.deepcopy(DEFINITION)
    definition["inputs"]["gate"]["dtype"] = "fp16"
    definition["axes"]["I"] = {"type": "const", "value": "96"}
    definition["surprise"] = True
    del definition["op_type"]
    definition_path, _ = make_tree(tmp_path, definition=definition)
    findings = check_paths([definition_path], tmp_path)
    text = definition_path.read_text().splitlines()

    def line_with(token):
        return next(i for i, line in enumerate(text, 1) if token in line)

    assert _lines_of(findings) == {
        ("INV014", line_with('"fp16"')),
        ("INV013", line_with('"96"')),
        ("INV011", line_with('"surprise"')),
        ("INV012", 1),
    }


def test_solution_schema_rules(tmp_path):
    solution = copy.deepcopy(SOLUTION)
    solution["spec"]["language"] = "triton"
    solution["spec"]["target_hardware"] = ["SM90", "H100"]
    solution["spec"]["entry_point"] = "kernel.py:run"
    solution["spec"]["binding"] = "torch"
    solution["sources"] = [{"path": "a.py", "lines": 3}]
    _, solution_path = make_tree(tmp_path, solution=solution)
    codes = codes_of(check_paths([solution_path], tmp_path))
    assert codes == ["INV011", "INV011", "INV014", "INV044", "INV045"]


def test_axis_kinds_are_discriminated(tmp_path):
    definition = copy.deepcopy(DEFINITION)
    definition["axes"]["T"] = {"type": "var", "value": 3}
    definition["axes"]["I"] = {"type": "const"}
    definition["axes"]["X"] = {"type": "dynamic"}
    definition_path, _ = make_tree(tmp_path, definition=definition)
    assert codes_of(check_paths([definition_path], tmp_path)) == ["INV011", "INV012", "INV014"]


def test_wrong_top_level_type(tmp_path):
    definition_path, _ = make_tree(tmp_path, definition=[1, 2, 3])
    assert codes_of(check_paths([definition_path], tmp_path)) == ["INV013"]


def test_file_outside_layout_is_sniffed_or_rejected(tmp_path):
    (tmp_path / ".git").mkdir()
    stray = tmp_path / "stray.json"
    stray.write_text(json.dumps({"hello": 1}))
    assert codes_of(check_paths([stray], tmp_path)) == ["INV006"]
    loose_definition = tmp_path / "qwen3_silu_and_mul.json"
    loose_definition.write_text(json.dumps(DEFINITION))
    assert check_paths([loose_definition], tmp_path) == []


def test_broken_symlink_and_fifo_are_findings(tmp_path):
    link = tmp_path / "dangling.json"
    link.symlink_to(tmp_path / "gone.json")
    assert load_json_file(link).code == "INV001"
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    finding = load_json_file(fifo)  # must not block waiting for a writer
    assert finding.code == "INV001" and "not a regular file" in finding.message


def test_code_table_and_constants_agree():
    from tilegym.kernel_inventory import codes

    constants = {v for k, v in vars(codes).items() if k.isupper() and isinstance(v, str)}
    assert constants == set(codes.CODES)
    assert len(codes.CODES) == len({v for v in codes.CODES.values()})


def test_index_of_is_an_input_key_naming_an_identifier(tmp_path):
    definition = copy.deepcopy(DEFINITION)
    definition["axes"]["E"] = {"type": "const", "value": 8}
    definition["inputs"]["ids"] = {"shape": ["T"], "dtype": "int32", "index_of": "E"}
    definition["reference"] = definition["reference"].replace("run(gate, up)", "run(gate, up, ids)")
    kernel = "def silu_and_mul(gate, up, ids):\n    return gate\n"
    definition_path, _ = make_tree(tmp_path, definition=definition, kernel_source=kernel)
    assert check_paths([definition_path], tmp_path) == []

    definition["inputs"]["ids"]["index_of"] = "8 experts"
    definition["outputs"]["out"]["index_of"] = "T"
    definition_path, _ = make_tree(tmp_path, definition=definition, kernel_source=kernel)
    findings = check_paths([definition_path], tmp_path)
    text = definition_path.read_text().splitlines()
    lines = [i for i, line in enumerate(text, 1) if '"index_of"' in line]
    assert _lines_of(findings) == {("INV014", lines[0]), ("INV011", lines[1])}
