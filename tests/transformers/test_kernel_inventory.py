"""Every kernel inventory file in the repository: schema, semantics, AOT compile and parity.

Files are discovered, not listed, so a new Definition/Solution pair is covered the moment it
lands. With no inventory files the per-file tests have nothing to run, and the discovery
tests still prove that discovery works.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tilegym.kernel_inventory.check import check_paths
from tilegym.kernel_inventory.compile import compile_paths, default_jobs, toolchain_problem
from tilegym.kernel_inventory.inventory import discover
from tilegym.kernel_inventory.parity import parity_paths

REPO_ROOT = Path(__file__).resolve().parents[2]
FILES = discover(REPO_ROOT)
SOLUTIONS = [p for p in FILES if p.parent.name == "kernel_solutions"]


def _ids(paths):
    return [p.relative_to(REPO_ROOT).as_posix() for p in paths]


def test_discovery_finds_every_inventory_file():
    base = REPO_ROOT / "src" / "tilegym" / "transformers"
    expected = sorted(
        p
        for p in base.rglob("*.json")
        if p.parent.name in ("kernel_definitions", "kernel_solutions")
        and p.parent.parent.parent == base
    )
    assert expected == FILES
    assert all(p.is_file() for p in FILES)


def test_discovery_on_a_planted_tree(tmp_path):
    planted = (
        tmp_path / "src" / "tilegym" / "transformers" / "toy" / "kernel_definitions" / "a.json"
    )
    planted.parent.mkdir(parents=True)
    planted.write_text(json.dumps({}))
    (planted.parent / "notes.txt").write_text("ignored")
    assert discover(tmp_path) == [planted]
    assert discover(tmp_path / "empty") == []


def test_whole_inventory_is_valid():
    findings = check_paths([], REPO_ROOT)
    assert not findings, "\n".join(map(str, findings))


@pytest.mark.parametrize("path", FILES, ids=_ids(FILES))
def test_inventory_file_is_valid(path):
    findings = check_paths([path], REPO_ROOT)
    assert not findings, "\n".join(map(str, findings))


# The compile run's own limit, which scales with the work: it stops only when no compile has
# finished for this long. The slowest kernel (decode attention) takes about 150 s on a quiet
# 2-core machine, so this catches a hung worker, not a loaded machine. Each finished compile is
# cached at once, so a stopped run continues where it stopped.
STALL_S = 900.0


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@pytest.fixture(scope="module")
def compile_findings():
    """One compile run over every Solution: shared kernels compile once, in parallel workers,
    each cached as it finishes, with a progress line each and a limit per compile."""
    problem = toolchain_problem()
    if problem is not None:
        pytest.skip(f"no cuTile compile toolchain: {problem}")
    return compile_paths(
        SOLUTIONS,
        REPO_ROOT,
        jobs=default_jobs(),
        progress=_progress,
        stall_s=STALL_S,
    )


# func_only: pytest's fixed per-test limit leaves out the shared fixture, which has its own.
@pytest.mark.slow
@pytest.mark.timeout(600, func_only=True)
@pytest.mark.parametrize("path", SOLUTIONS, ids=_ids(SOLUTIONS))
def test_solution_compiles_for_every_target(path, compile_findings):
    shown = path.relative_to(REPO_ROOT).as_posix()
    findings = [f for f in compile_findings if f.path == shown]
    assert not findings, "\n".join(map(str, findings))


@pytest.mark.gpu
@pytest.mark.parametrize("path", SOLUTIONS, ids=_ids(SOLUTIONS))
def test_solution_matches_reference_on_gpu(path):
    findings = parity_paths([path], REPO_ROOT, device="cuda")
    assert not findings, "\n".join(map(str, findings))
