"""The two test tiers of ``tests/conftest.py``, run as real pytest subprocesses on a planted
test file: the default run leaves out tests marked ``slow`` (and says how to run them),
``--slow`` runs them, and a slow test's long fixture shows its progress while it runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")

PLANTED = """
import sys

import pytest


@pytest.fixture(scope="module")
def long_setup():
    print("compile 1/2: ok", file=sys.stderr, flush=True)
    return 1


def test_fast():
    pass


@pytest.mark.slow
def test_slow(long_setup):
    assert long_setup == 1
"""


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_planted.py").write_text(PLANTED)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n    gpu: gpu\n")
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(tmp_path), *args]
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_the_default_tier_leaves_slow_tests_out_and_says_how_to_run_them(tmp_path):
    result = _pytest(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed, 1 deselected" in result.stdout
    assert "1 slow tests left out" in result.stdout
    assert "bash scripts/test.sh --all" in result.stdout
    assert "compile 1/2" not in result.stdout + result.stderr


def test_slow_runs_them_and_their_fixtures_progress_is_not_captured(tmp_path):
    result = _pytest(tmp_path, "--slow")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout and "deselected" not in result.stdout
    assert "compile 1/2: ok" in result.stderr  # shown as it happens, not in a captured report
