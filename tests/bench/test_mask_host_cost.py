"""The decode-step mask cost table, run end to end on the CPU."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks/e2e/mask_host_cost.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_one_row_a_window_with_both_builders():
    done = _run("--windows", "0", "64", "--calls", "2", "--repeats", "2", "--warmup", "1")
    assert done.returncode == 0, done.stderr
    rows = re.findall(r"^\| (\w+) \| ([\d.]+) \[[\d., ]+\] \| ([\d.]+) \[", done.stdout, re.M)
    assert [r[0] for r in rows] == ["causal", "64"]
    assert all(float(a) > 0 and float(b) > 0 for _, a, b in rows)


@pytest.mark.slow
def test_bad_arguments_get_one_line():
    done = _run("--position", "5000")
    assert done.returncode == 2 and "--position must lie in" in done.stderr
    done = _run("--windows", "-1")
    assert done.returncode == 2 and "--windows must be at least 0" in done.stderr
