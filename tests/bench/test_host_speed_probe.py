"""The host speed probe end to end: both blocks' rows and every run, one line for bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks/e2e/host_speed_probe.py"


def _run(*args):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )


def test_three_runs_print_both_blocks_and_every_run():
    done = _run("--runs", "3")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| all", "| pinned"))]
    assert len(rows) == 2
    for row in rows:
        median, cv = row.split(" | ")[1:3]
        assert float(median) > 0 and cv.endswith("%")
    runs = done.stdout.strip().splitlines()[-1].split()
    assert len(runs) == 3 and all(float(a) > 0 and float(b) > 0 for a, b in
                                  (r.split("/") for r in runs))  # fmt: skip


def test_bad_arguments_get_one_line():
    done = _run("--runs", "2")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("--runs must be at least 3")
