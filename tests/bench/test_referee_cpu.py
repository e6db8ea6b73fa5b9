"""The referee on MoE models a CPU runs (``benchmarks/e2e/referee_cpu.py``): its one-line usage
errors, and on one seed of the DeepSeek-V3-routed model the case the referee without group
sites could not referee (0.249 from fp32 on this CPU) scored within rounding with them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks/e2e/referee_cpu.py"
ENV = os.environ | {
    "PYTHONPATH": os.pathsep.join(str(ROOT / d) for d in ("src", "modeling/transformers/src"))
}


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=ENV, timeout=600
    )


def test_bad_arguments_are_one_line():
    done = _run("--seeds", "3", "3")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].endswith("--seeds 3 3: need 0 <= FIRST < END")
    done = _run("--model", "mixtral")
    assert done.returncode == 2 and "invalid choice: 'mixtral'" in done.stderr.splitlines()[-1]


@pytest.mark.slow
def test_group_sites_referee_the_case_expert_sites_could_not():
    done = _run("--model", "deepseek_v3", "--seeds", "4", "5")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 4 |")]
    before, after = (row.split(" | ")[2].split(",")[0].split() for row in rows)
    # "workload REFEREED / PLAIN": unrefereeable before (0.249 on this CPU), rounding after
    assert before[0] == after[0] == "workload" and before[3] == after[3]
    assert float(before[1]) > 0.2 and float(after[1]) < 0.05
