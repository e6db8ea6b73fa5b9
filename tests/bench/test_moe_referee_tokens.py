"""The MoE referee's per-token account, end to end on a tiny preset on the CPU, and its
one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks/e2e/moe_referee_tokens.py"
ENV = os.environ | {
    "PYTHONPATH": os.pathsep.join(
        str(ROOT / d) for d in ("src", "modeling/transformers/src", "benchmarks/e2e")
    )
}


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=ENV,
        timeout=timeout,
    )  # fmt: skip


def test_bad_inputs_get_one_line():
    done = _run("--model-key", "nope")
    assert done.returncode == 2 and "--model-key 'nope' is not a preset" in done.stderr
    done = _run("--model-key", "tiny-mixtral", "--workload", "huge")
    assert done.returncode == 2 and "--workload 'huge' is not one of" in done.stderr
    done = _run("--model-key", "tiny-qwen3", "--device", "cpu")
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == (
        "error: tiny-qwen3 has no MoE router the referee knows"
    )


@pytest.mark.slow
def test_four_sides_are_scored_and_their_worst_tokens_explained():
    done = _run("--model-key", "tiny-mixtral", "--device", "cpu", "--worst", "1", "--show", "2")
    assert done.returncode == 0, done.stderr
    sides = [line for line in done.stdout.splitlines() if line.startswith("## ")]
    assert [line.split(":")[0] for line in sides] == [
        "## PyTorch static", "## cuTile static", "## PyTorch eager", "## cuTile eager"
    ]  # fmt: skip
    assert all("p50" in line and "tokens over" in line for line in sides)
    assert sum(line.startswith("token ") for line in done.stdout.splitlines()) == 4
    reports = [line for line in done.stdout.splitlines() if "as this side reports" in line]
    assert len(reports) == 4 and all("refused" in line for line in reports)
