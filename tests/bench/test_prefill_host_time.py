"""The eager-prefill host probe, run end to end on a tiny preset on the CPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks/e2e/prefill_host_time.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"CUDA_VISIBLE_DEVICES": ""},
    )


@pytest.mark.slow
def test_tiny_preset_on_the_cpu_prints_both_sides_and_every_run():
    done = _run("--model-key", "tiny-qwen3", "--device", "cpu", "--runs", "2", "--warmup", "1")
    assert done.returncode == 0, done.stderr
    rows = re.findall(r"^\| (PyTorch static|cuTile static) \| ([\d.]+) \[", done.stdout, re.M)
    assert [side for side, _ in rows] == ["PyTorch static", "cuTile static"]
    assert all(float(issue) > 0 for _, issue in rows)
    # On the CPU the forward returns when its work is done: issue time is the wall time.
    assert re.findall(r"\| (1\.00) \|$", done.stdout, re.M) == ["1.00", "1.00"]
    assert re.search(r"^\| 2 \| [\d.]+ / [\d.]+ \| [\d.]+ / [\d.]+ \|$", done.stdout, re.M)


@pytest.mark.slow
def test_bad_arguments_and_a_missing_gpu_get_one_line():
    done = _run("--runs", "0", "--device", "cpu")
    assert done.returncode == 2 and "--runs must be at least 1" in done.stderr
    done = _run("--model-key", "nope", "--device", "cpu")
    assert done.returncode == 2 and "--model-key 'nope' is not a preset" in done.stderr
    done = _run("--model-key", "tiny-qwen3")
    assert done.returncode == 2 and done.stderr == "error: --device cuda needs a CUDA GPU\n"
