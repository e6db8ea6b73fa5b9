"""Which Solutions a command works on, given Solution, Definition or Python file paths."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tilegym.kernel_inventory.imports import ImportGraph
from tilegym.kernel_inventory.inventory import discover, load, pair_of
from tilegym.kernel_inventory.models import Solution


def select_solutions(
    paths: Iterable[Path], repo_root: Path, graph: ImportGraph | None = None
) -> list[Path]:
    """Solution files for the given paths (Solution, Definition or kernel ``.py``); all if none.

    Every Solution's files are computed once per call, however many ``.py`` paths are given.
    """
    paths = list(paths)
    all_files = discover(repo_root)
    solutions = [p for p in all_files if p.parent.name == "kernel_solutions"]
    if not paths:
        return solutions
    files_of: dict[Path, set[Path]] | None = None
    selected: dict[Path, None] = {}
    for path in paths:
        if path.suffix == ".py":
            if files_of is None:
                files_of = _files_by_solution(solutions, repo_root, graph)
            target = path.resolve()
            for solution_path, files in files_of.items():
                if target in files:
                    selected.setdefault(solution_path, None)
            continue
        if path.parent.name == "kernel_definitions":
            other = pair_of(path)
            selected.setdefault(other if other is not None else path, None)
            continue
        selected.setdefault(path, None)
    return list(selected)


def _files_by_solution(
    solutions: list[Path], repo_root: Path, graph: ImportGraph | None
) -> dict[Path, set[Path]]:
    graph = graph or ImportGraph(repo_root / "src")
    out: dict[Path, set[Path]] = {}
    for solution_path in solutions:
        loaded = load(solution_path, repo_root)
        if isinstance(loaded.model, Solution):
            out[solution_path] = solution_files(loaded.model, repo_root, graph)
    return out


def solution_files(
    solution: Solution, repo_root: Path, graph: ImportGraph | None = None
) -> set[Path]:
    """The Solution's sources plus every repository file they import (transitively)."""
    graph = graph or ImportGraph(repo_root / "src")
    files: set[Path] = set()
    for source in {*solution.sources, solution.spec.entry_file}:
        path = (repo_root / source).resolve()
        files.add(path)
        files.update(graph.dependencies(path))
    return files
