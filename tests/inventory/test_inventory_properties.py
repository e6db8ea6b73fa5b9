"""Property tests: no input crashes the loader, the checks or the permalink parser."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from inventory_helpers import DEFINITION, FINDING_LINE, SOLUTION, make_tree, model_dir

from tilegym.kernel_inventory.check import check_paths
from tilegym.kernel_inventory.permalink import (
    Permalink,
    PermalinkError,
    iter_source_lines,
    parse_permalink,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)


def _check_tree(write) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_tree(root)
        write(root)
        lines = [str(f) for f in check_paths([], root)]
    for line in lines:
        assert FINDING_LINE.match(line), line
        assert "\n" not in line
    return lines


@SETTINGS
@given(value=json_values, folder=st.sampled_from(["kernel_definitions", "kernel_solutions"]))
def test_random_json_documents_give_only_finding_lines(value, folder):
    def write(root):
        target = model_dir(root) / folder / "qwen3_silu_and_mul.json"
        target.write_text(json.dumps(value), encoding="utf-8")

    assert _check_tree(write)  # a random document is never a valid Definition/Solution


@SETTINGS
@given(raw=st.binary(max_size=300))
def test_random_bytes_give_only_finding_lines(raw):
    def write(root):
        (model_dir(root) / "kernel_definitions" / "qwen3_silu_and_mul.json").write_bytes(raw)

    _check_tree(write)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _paths(child, (*prefix, index))


DEFINITION_PATHS = [p for p in _paths(DEFINITION) if p]
SOLUTION_PATHS = [p for p in _paths(SOLUTION) if p]


def _replace(document, path, value):
    document = copy.deepcopy(document)
    node = document
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return document


@SETTINGS
@given(
    kind=st.sampled_from(["definition", "solution"]),
    index=st.integers(min_value=0),
    value=json_values,
)
def test_one_corrupted_field_never_crashes(kind, index, value):
    base, paths = (
        (DEFINITION, DEFINITION_PATHS) if kind == "definition" else (SOLUTION, SOLUTION_PATHS)
    )
    document = _replace(base, paths[index % len(paths)], value)
    folder = "kernel_definitions" if kind == "definition" else "kernel_solutions"

    def write(root):
        target = model_dir(root) / folder / "qwen3_silu_and_mul.json"
        target.write_text(json.dumps(document), encoding="utf-8")

    _check_tree(write)


@SETTINGS
@given(reference=st.text(max_size=200))
def test_random_reference_text_never_crashes(reference):
    def write(root):
        target = model_dir(root) / "kernel_definitions" / "qwen3_silu_and_mul.json"
        target.write_text(json.dumps({**DEFINITION, "reference": reference}), encoding="utf-8")

    _check_tree(write)


hexes = st.text(alphabet="0123456789abcdefABCDEFg", min_size=0, max_size=42)
url_parts = st.builds(
    lambda scheme, host, owner, kind, sha, path, anchor: (
        f"{scheme}{host}/{owner}/repo/{kind}/{sha}/{path}{anchor}"
    ),
    st.sampled_from(["https://", "http://", ""]),
    st.sampled_from(["github.com", "huggingface.co", "example.com"]),
    st.sampled_from(["owner", "", "-x", "a.b"]),
    st.sampled_from(["blob", "tree", "raw"]),
    hexes,
    st.sampled_from(["a.py", "src/a.py", "", "../a.py", "a b.py"]),
    st.sampled_from(["", "#L1", "#L3-L2", "#L2-L9", "#L0", "#l1", "#L1-L", "#Lx"]),
)


@settings(max_examples=300, deadline=None)
@given(url=st.text(max_size=120) | url_parts)
def test_permalink_parser_is_total_and_consistent(url):
    result = parse_permalink(url)
    assert isinstance(result, Permalink | PermalinkError)
    if isinstance(result, PermalinkError):
        assert result.message and "\n" not in result.message
    else:
        assert 1 <= result.first <= result.last
        assert len(result.commit) == 40
        assert parse_permalink(result.url) == result
    list(iter_source_lines(url))
