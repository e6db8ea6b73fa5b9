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
