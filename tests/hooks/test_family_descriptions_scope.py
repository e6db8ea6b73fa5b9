"""The scope rule on this repository's own files: every family's description is its
experiment's to change, and the modules shared by every family are no experiment's."""

from __future__ import annotations

from pathlib import Path

import pytest
from tilegym_hooks.scope_rules import Change, scope_findings

import tilegym.transformers

ROOT = Path(tilegym.transformers.__file__).parent
FAMILIES = sorted(d.name for d in ROOT.iterdir() if (d / f"modeling_{d.name}.py").is_file())
SHARED = sorted(p.name for p in ROOT.glob("*.py") if p.name != "monkey_patch.py")


def edited(path: Path) -> Change:
    """A change that appends one statement to the real file at ``path``."""
    text = path.read_bytes()
    repo_path = f"src/tilegym/transformers/{path.relative_to(ROOT).as_posix()}"
    return Change(repo_path, text, text + b"\nEXTRA = 1\n")


def test_the_repository_has_families_and_shared_modules():
    assert {"llama", "qwen3", "mistral", "gemma3", "qwen3_moe"} <= set(FAMILIES)
    assert {"decoder.py", "family.py", "attention.py", "moe_block.py"} <= set(SHARED)


@pytest.mark.parametrize("key", FAMILIES)
def test_a_familys_experiment_may_change_its_real_description(key):
    change = edited(ROOT / key / f"modeling_{key}.py")
    assert [str(f) for f in scope_findings(key, [change])] == []


@pytest.mark.parametrize("name", SHARED)
def test_no_familys_experiment_may_change_a_shared_module(name):
    change = edited(ROOT / name)
    line = len(change.base.splitlines()) + 1
    for key in FAMILIES:
        assert [str(f) for f in scope_findings(key, [change])] == [
            f"{change.path}:{line}: SCOPE001 shared by every family, outside the scope of a "
            f"{key!r} experiment (wire a kernel in through Family.forwards in modeling_{key}.py)"
        ]


ENTRY_ROOT = ROOT.parent / "ops" / "entry"
SHARED_ENTRIES = sorted(p.name for p in ENTRY_ROOT.glob("*.py"))


@pytest.mark.parametrize("name", SHARED_ENTRIES)
def test_no_familys_experiment_may_change_a_shared_entry_point(name):
    """Other families' Solutions name these (issue 44): an experiment reuses one from its own
    Solution or writes its own variant in its kernels/ folder."""
    text = (ENTRY_ROOT / name).read_bytes()
    path = f"src/tilegym/ops/entry/{name}"
    change = Change(path, text, text + b"\nEXTRA = 1\n")
    line = len(text.splitlines()) + 1
    for key in FAMILIES:
        assert [str(f) for f in scope_findings(key, [change])] == [
            f"{path}:{line}: SCOPE001 a kernel entry point shared by every family, outside the "
            f"scope of a {key!r} experiment (name it in {key}'s Solution, or write {key}'s own "
            f"variant in src/tilegym/transformers/{key}/kernels/)"
        ]


def test_a_familys_experiment_may_point_its_solution_at_a_shared_entry_point_or_its_own():
    """Its Solutions and its kernels/ folder are its own; a new file there passes the scope
    rule (the code rules still apply to it)."""
    solution = "src/tilegym/transformers/qwen3/kernel_solutions/qwen3_rms_norm.json"
    text = (ROOT / "qwen3" / "kernel_solutions" / "qwen3_rms_norm.json").read_bytes()
    own = "src/tilegym/transformers/qwen3/kernels/rms_norm.py"
    kernel = b"from tilegym.ops.entry import rms_norm as _shared\n\nrms_norm = _shared.rms_norm\n"
    changes = [
        Change(solution, text, text.replace(b"ops/entry/rms_norm.py", b"transformers/qwen3/k.py")),
        Change(own, None, kernel),
    ]
    assert [str(f) for f in scope_findings("qwen3", changes)] == []
    assert len(SHARED_ENTRIES) >= 10 and "__init__.py" in SHARED_ENTRIES
