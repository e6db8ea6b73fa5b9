"""Which Solutions a command works on, given Solution, Definition or Python file paths."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tilegym.kernel_inventory.imports import local_dependencies
from tilegym.kernel_inventory.inventory import discover, load, pair_of
from tilegym.kernel_inventory.models import Solution


def select_solutions(paths: Iterable[Path], repo_root: Path) -> list[Path]:
    """Solution files for the given paths (Solution, Definition or kernel ``.py``); all if none."""
    paths = list(paths)
    all_files = discover(repo_root)
    if not paths:
        return [p for p in all_files if p.parent.name == "kernel_solutions"]
    selected: dict[Path, None] = {}
    solutions = [p for p in all_files if p.parent.name == "kernel_solutions"]
    for path in paths:
        if path.suffix == ".py":
            target = path.resolve()
            for solution_path in solutions:
                loaded = load(solution_path, repo_root)
                if isinstance(loaded.model, Solution) and target in solution_files(
                    loaded.model, repo_root
                ):
                    selected.setdefault(solution_path, None)
            continue
        if path.parent.name == "kernel_definitions":
            other = pair_of(path)
            selected.setdefault(other if other is not None else path, None)
            continue
        selected.setdefault(path, None)
    return list(selected)


def solution_files(solution: Solution, repo_root: Path) -> set[Path]:
    """The Solution's sources plus every repository file they import (transitively)."""
    files: set[Path] = set()
    for source in {*solution.sources, solution.spec.entry_file}:
        path = (repo_root / source).resolve()
        files.add(path)
        files.update(local_dependencies(path, repo_root / "src"))
    return files
