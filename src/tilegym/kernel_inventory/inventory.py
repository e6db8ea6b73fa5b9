"""Find, pair and load inventory files: the I/O around the pure schema and semantic rules.

Layout (DESIGN.md): ``src/tilegym/transformers/<model_key>/kernel_definitions/<name>.json``
pairs with ``.../kernel_solutions/<name>.json`` (same stem).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tilegym.findings import Finding
from tilegym.kernel_inventory import codes
from tilegym.kernel_inventory.jsonfile import JsonFile, finding, load_json_file
from tilegym.kernel_inventory.models import Definition, Solution
from tilegym.kernel_inventory.schema import schema_findings
from tilegym.kernel_inventory.semantics import (
    definition_findings,
    entry_signature_findings,
    solution_findings,
)

DEFINITIONS_DIR = "kernel_definitions"
SOLUTIONS_DIR = "kernel_solutions"
TRANSFORMERS_DIR = ("src", "tilegym", "transformers")


@dataclass
class Loaded:
    """One inventory file after loading: its typed model when schema-valid, and its findings."""

    path: Path
    shown: str
    kind: str | None
    doc: JsonFile | None = None
    model: Definition | Solution | None = None
    findings: list[Finding] = field(default_factory=list)


def find_repo_root(start: Path | None = None) -> Path:
    """The nearest directory at or above ``start`` (default: cwd) holding ``.git``; else cwd."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / ".git").exists():
            return candidate
    return here


def discover(repo_root: Path) -> list[Path]:
    """Every Definition and Solution JSON under ``src/tilegym/transformers/*``, sorted."""
    base = repo_root.joinpath(*TRANSFORMERS_DIR)
    found: list[Path] = []
    for sub in (DEFINITIONS_DIR, SOLUTIONS_DIR):
        found.extend(p for p in base.glob(f"*/{sub}/*.json") if p.is_file())
    return sorted(found)


def pair_of(path: Path) -> Path | None:
    """The other file of a Definition/Solution pair by layout (None outside the layout)."""
    parent = path.parent.name
    if parent == DEFINITIONS_DIR:
        return path.parent.parent / SOLUTIONS_DIR / path.name
    if parent == SOLUTIONS_DIR:
        return path.parent.parent / DEFINITIONS_DIR / path.name
    return None


def with_pairs(paths: Iterable[Path]) -> list[Path]:
    """``paths`` plus the existing pair of each, without duplicates, order kept."""
    result: dict[Path, None] = {}
    for path in paths:
        result.setdefault(path, None)
        other = pair_of(path)
        if other is not None and other.is_file():
            result.setdefault(other, None)
    return list(result)


def shown_path(path: Path, repo_root: Path) -> str:
    """Repo-relative POSIX path when ``path`` is inside the repository, else as given."""
    try:
        return path.resolve().relative_to(repo_root.resolve()).as_posix()
    except (ValueError, OSError, RuntimeError):
        return os.fspath(path)


def kind_of(path: Path, data: object) -> str | None:
    """ "definition" or "solution": by directory first, by content otherwise."""
    parent = path.parent.name
    if parent == DEFINITIONS_DIR:
        return "definition"
    if parent == SOLUTIONS_DIR:
        return "solution"
    if isinstance(data, dict):
        if "spec" in data or "definition" in data:
            return "solution"
        if "reference" in data or "axes" in data:
            return "definition"
    return None


def load(path: Path, repo_root: Path) -> Loaded:
    """Load one file and run the schema and per-file semantic rules on it."""
    shown = shown_path(path, repo_root)
    result = load_json_file(path, shown)
    if isinstance(result, Finding):
        return Loaded(path, shown, kind_of(path, None), findings=[result])
    doc = result
    kind = kind_of(path, doc.data)
    loaded = Loaded(path, shown, kind, doc)
    if kind is None:
        loaded.findings.append(
            finding(
                shown,
                1,
                codes.FILE_KIND_UNKNOWN,
                f"not in {DEFINITIONS_DIR}/ or {SOLUTIONS_DIR}/ and not recognizable as either",
            )
        )
        return loaded
    loaded.findings.extend(schema_findings(doc, kind))
    if loaded.findings:
        return loaded
    stem = path.stem
    try:
        model = (Definition if kind == "definition" else Solution).from_dict(doc.data)
    except (KeyError, TypeError, ValueError) as exc:  # the schema should have caught it
        loaded.findings.append(
            finding(shown, 1, codes.SCHEMA_OTHER, f"{kind} does not load: {type(exc).__name__}")
        )
        return loaded
    loaded.model = model
    if isinstance(model, Definition):
        loaded.findings.extend(definition_findings(doc, model, stem))
    else:
        loaded.findings.extend(solution_findings(doc, model, stem, repo_root))
    return loaded


def pairing_findings(loaded: Loaded) -> list[Finding]:
    """A Definition needs its Solution and vice versa (same stem, same model directory)."""
    other = pair_of(loaded.path)
    if other is None or loaded.kind is None or other.is_file():
        return []
    if loaded.kind == "definition":
        return [
            finding(
                loaded.shown,
                1,
                codes.DEFINITION_UNPAIRED,
                f"no Solution {SOLUTIONS_DIR}/{loaded.path.name} for this Definition",
            )
        ]
    return [
        finding(
            loaded.shown,
            1,
            codes.SOLUTION_UNPAIRED,
            f"no Definition {DEFINITIONS_DIR}/{loaded.path.name} for this Solution",
        )
    ]


def resolve_targets(paths: Iterable[Path], repo_root: Path) -> list[Path]:
    """The files a command works on: the given ones (directories searched) with their pairs,
    or every inventory file when none are given."""
    paths = list(paths)
    if not paths:
        return discover(repo_root)
    expanded: list[Path] = []
    for path in paths:
        if path.is_dir():
            expanded.extend(
                sorted(
                    p
                    for p in path.rglob("*.json")
                    if p.parent.name in (DEFINITIONS_DIR, SOLUTIONS_DIR) and p.is_file()
                )
            )
        else:
            expanded.append(path)
    return with_pairs(expanded)


def check_files(paths: Iterable[Path], repo_root: Path) -> tuple[list[Loaded], list[Finding]]:
    """Load and check ``paths`` (already expanded); return the loaded files and all findings."""
    loaded_files = [load(path, repo_root) for path in paths]
    findings: list[Finding] = []
    for loaded in loaded_files:
        findings.extend(loaded.findings)
        findings.extend(pairing_findings(loaded))
    for solution, definition in solutions_and_definitions(loaded_files):
        if definition is not None and solution.doc is not None:
            findings.extend(
                entry_signature_findings(solution.doc, solution.model, definition.model, repo_root)
            )
    return loaded_files, findings


def solutions_and_definitions(
    loaded_files: Iterable[Loaded],
) -> list[tuple[Loaded, Loaded | None]]:
    """Each schema-valid Solution with its schema-valid Definition (by pair layout or name)."""
    loaded_files = list(loaded_files)
    definitions = {
        item.model.name: item
        for item in loaded_files
        if item.kind == "definition" and isinstance(item.model, Definition)
    }
    by_path = {item.path.resolve(): item for item in loaded_files}
    pairs = []
    for item in loaded_files:
        if item.kind != "solution" or not isinstance(item.model, Solution):
            continue
        other = pair_of(item.path)
        definition = by_path.get(other.resolve()) if other is not None else None
        if definition is None or not isinstance(definition.model, Definition):
            definition = definitions.get(item.model.definition)
        pairs.append((item, definition))
    return pairs
