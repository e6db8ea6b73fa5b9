"""The static-mode noise script end to end on the CPU (tiny preset): both blocks, both sides."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks/e2e/static_run_noise.py"


def _run(*args, timeout=600):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_tiny_preset_on_the_cpu_prints_every_block_and_run_of_both_cache_policies():
    done = _run("--model-key", "tiny-qwen3", "--device", "cpu", "--runs", "3", "--cache", "fresh",
                "kept")  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| fresh ", "| kept "))]
    assert len(rows) == 2 * (4 + 12)  # per policy: a summary row per block and side, every run
    summary = rows[0].split(" | ")
    assert summary[0] == "| fresh alone" and summary[1] == "PyTorch static"
    assert float(summary[2]) > 0 and summary[-1] == "0 |"  # a CPU records no CUDA graphs


@pytest.mark.slow
def test_bad_arguments_get_one_line():
    done = _run("--runs", "2", timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("--runs must be at least 3")
