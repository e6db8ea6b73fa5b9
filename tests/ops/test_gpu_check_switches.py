"""``benchmarks/ops/gpu_check_switches.sh`` stays true: each shard's pytest selection collects
GPU tests (a typo would run none and pass), and every switch its table names exists in its
module and ships as its row says (``on`` or ``off``)."""

from __future__ import annotations

import importlib
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks/ops/gpu_check_switches.sh"


def _shards() -> list[tuple[str, list[str]]]:
    out = []
    for line in SCRIPT.read_text().splitlines():
        if line.startswith("shard "):
            name, *args = shlex.split(line)[1:]
            out.append((name, args))
    return out


def _switches() -> list[tuple[str, str, str]]:
    """(module, attribute, on|off) of each ``module.SWITCH  on|off`` row of the header's table."""
    header = [line for line in SCRIPT.read_text().splitlines() if line.startswith("#   ")]
    return re.findall(r"#   (\w+)\.([A-Z_][A-Z0-9_]*)\s+(on|off)\b", "\n".join(header))


def test_the_script_has_shards_and_switches():
    assert len(_shards()) == 2
    assert len(_switches()) == 1


def test_the_split_scan_diagnostic_starts_on_a_cpu_host():
    """Its imports (the GPU tests' shapes and inputs) and arguments hold without a GPU."""
    script = ROOT / "benchmarks/ops/diag_split_scan.py"
    result = subprocess.run(
        [sys.executable, str(script), "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--reps" in result.stdout


@pytest.mark.parametrize(("name", "args"), _shards(), ids=[n for n, _ in _shards()])
def test_each_shard_collects_gpu_tests(name, args):
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    result = subprocess.run(
        [*cmd, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    collected = [line for line in result.stdout.splitlines() if "::" in line]
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert collected, f"shard {name} selects no test"


@pytest.mark.parametrize(("module", "attr", "ships"), _switches())
def test_each_switch_named_ships_as_its_row_says(module, attr, ships):
    mod = importlib.import_module(f"tilegym.ops.{module}")
    assert hasattr(mod, attr), f"tilegym.ops.{module} has no {attr}"
    actual = "on" if getattr(mod, attr) else "off"
    assert actual == ships, f"{module}.{attr} is {actual}; {SCRIPT.name}'s table says {ships}"
