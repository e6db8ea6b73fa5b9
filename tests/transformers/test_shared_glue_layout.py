"""The shared glue belongs to no family: no family's module imports another family's folder,
and no shared module imports any family's, so one family's experiment can change only what its
own model runs. Read by parsing, nothing imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tilegym.transformers

ROOT = Path(tilegym.transformers.__file__).parent
FAMILIES = sorted(d.name for d in ROOT.iterdir() if (d / f"modeling_{d.name}.py").is_file())


def family_imports(path: Path) -> set[str]:
    """The family folders whose modules ``path`` imports (``tilegym.transformers.<key>...``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["tilegym", "transformers"] and len(parts) > 2:
                found.add(parts[2])
    return found & set(FAMILIES)


@pytest.mark.parametrize("key", FAMILIES)
def test_a_family_imports_no_other_familys_folder(key):
    assert family_imports(ROOT / key / f"modeling_{key}.py") <= {key}


def test_the_shared_modules_import_no_family():
    shared = sorted(ROOT.glob("*.py"))
    assert {p.name for p in shared} >= {"decoder.py", "family.py", "monkey_patch.py"}
    assert {p.name: family_imports(p) for p in shared} == {p.name: set() for p in shared}
