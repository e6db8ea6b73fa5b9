"""Property tests of the pure scope rule (no git): random path sets and random module edits."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tilegym_hooks.paths import MAX_PARSED_BYTES, MONKEY_PATCH, PREFIXES_YAML, TILEGYM_PATCH
from tilegym_hooks.scope_rules import (
    Change,
    first_changed_line,
    model_key_from_branch,
    scope_findings,
)

KEYS = ["qwen3", "llama", "qwen3_moe"]
SEGMENTS = [
    "src", "tilegym", "transformers", "qwen3", "llama", "qwen3_moe", "kernels",
    "kernel_definitions", "kernel_solutions", "modeling_qwen3.py", "modeling_llama.py",
    "a.py", "b.json", "c.txt", ".py", "..", "modeling", "scripts", "benchmark_hf_model.sh",
]  # fmt: skip
CONTENT_CHECKED = {MONKEY_PATCH, TILEGYM_PATCH, PREFIXES_YAML}


def allowed_by_spec(key: str, path: str) -> bool:
    """The brief's list of freely changeable files, written independently as one regex."""
    model = rf"src/tilegym/transformers/{key}/"
    pattern = (
        rf"{model}modeling_{key}\.py|{model}kernels/[^/]+\.py"
        rf"|{model}kernel_(definitions|solutions)/[^/]+\.json"
        r"|modeling/transformers/scripts/benchmark_hf_model\.sh"
    )
    return re.fullmatch(pattern, path) is not None and ".." not in path.split("/")


tails = st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=4).map("/".join)
paths = st.one_of(
    tails,
    st.tuples(st.sampled_from(KEYS), tails).map(
        lambda t: f"src/tilegym/transformers/{t[0]}/{t[1]}"
    ),
    st.sampled_from(["modeling/transformers/scripts/benchmark_hf_model.sh", "README.md"]),
    st.sampled_from(SEGMENTS).map(lambda name: f"src/tilegym/transformers/{name}"),
)


def message_by_spec(key: str, path: str) -> str:
    """The SCOPE001 message: a module directly in transformers/ is shared by every family."""
    message = f"outside the scope of a {key!r} experiment"
    if re.fullmatch(r"src/tilegym/transformers/[^/]+", path):
        return (
            f"shared by every family, {message} "
            f"(wire a kernel in through Family.forwards in modeling_{key}.py)"
        )
    return message


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(KEYS), changed=st.sets(paths, max_size=12))
def test_path_rule_matches_the_spec(key, changed):
    changed -= CONTENT_CHECKED
    changes = [Change(path, b"old\n", b"new\n") for path in sorted(changed)]
    findings = scope_findings(key, changes)
    flagged = {f.path for f in findings}
    assert flagged == {p for p in changed if not allowed_by_spec(key, p)}
    assert len(findings) == len(flagged)
    assert {f.code for f in findings} <= {"SCOPE001"}
    assert all(str(f) == f"{f.path}:1: SCOPE001 {message_by_spec(key, f.path)}"
               for f in findings)  # fmt: skip


NAMES = ["_helper", "apply_tilegym_kernel_to_qwen3", "apply_tilegym_kernel_to_llama", "other"]


def module(bodies: dict[str, int], comments: bool = False) -> bytes:
    """A module with the functions NAMES, each returning its number (optionally commented)."""
    parts = ['"""patches"""\n', "import importlib\n"]
    for name in NAMES:
        value = bodies[name]
        note = "    # a comment\n\n" if comments else ""
        parts.append(f"\n\ndef {name}(model=None):\n{note}    return {value}\n")
    return "".join(parts).encode()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.fixed_dictionaries({n: st.integers(0, 3) for n in NAMES}),
    head=st.fixed_dictionaries({n: st.integers(0, 3) for n in NAMES}),
    comments=st.booleans(),
)
def test_monkey_patch_rule_flags_exactly_changes_outside_the_models_function(base, head, comments):
    change = Change(MONKEY_PATCH, module(base), module(head, comments))
    findings = scope_findings("qwen3", [change])
    others_changed = [n for n in NAMES if n != NAMES[1] and base[n] != head[n]]
    if not others_changed:
        assert findings == []
    else:
        assert [f.code for f in findings] == ["SCOPE002"]
        assert f"function {others_changed[0]!r}" in findings[0].message


@given(
    common=st.lists(st.text("ab \t#", max_size=5), max_size=5),
    old_tail=st.lists(st.text("xy", max_size=3), max_size=3),
    new_tail=st.lists(st.text("xz", max_size=3), max_size=3),
)
def test_first_changed_line_is_where_the_texts_start_to_differ(common, old_tail, new_tail):
    old = "".join(f"{line}\n" for line in common + old_tail).encode()
    new = "".join(f"{line}\n" for line in common + new_tail).encode()
    line = first_changed_line(old, new)
    old_lines, new_lines = old.splitlines(), new.splitlines()
    assert old_lines[: line - 1] == new_lines[: line - 1]
    if old != new:
        assert old_lines[line - 1 : line] != new_lines[line - 1 : line]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_guarded_files_with_junk_give_one_finding_never_an_exception(junk):
    changes = [Change(path, b"prefixes: []\n", junk) for path in sorted(CONTENT_CHECKED)]
    findings = scope_findings("qwen3", changes)
    assert len({f.path for f in findings}) == len(findings)
    for finding in findings:
        assert finding.code in {"SCOPE002", "SCOPE003", "SCOPE005"}
        assert 1 <= finding.line <= junk.count(b"\n") + 2


def test_model_key_from_branch_names():
    assert model_key_from_branch("experiment/qwen3/rms-norm") == "qwen3"
    assert model_key_from_branch("experiment/gpt_neox/a/b") == "gpt_neox"
    assert model_key_from_branch("main") is None
    assert model_key_from_branch("feature/experiment/qwen3/x") is None
    for bad in ("experiment/qwen3", "experiment/Qwen3/x", "experiment//x"):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            model_key_from_branch(bad)


def test_huge_guarded_files_are_reported_not_parsed():
    huge = b"x = 1\n" * (MAX_PARSED_BYTES // 6 + 1)
    changes = [Change(path, b"prefixes: []\n", huge) for path in sorted(CONTENT_CHECKED)]
    findings = scope_findings("qwen3", changes)
    assert [str(f) for f in findings] == [
        f"{path}:1: SCOPE005 cannot check scope: file is larger than {MAX_PARSED_BYTES} bytes"
        for path in sorted(CONTENT_CHECKED)
    ]
