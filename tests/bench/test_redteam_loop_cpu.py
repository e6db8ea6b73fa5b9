"""The judge against planted experiments through the real local loop on the CPU
(``benchmarks/judge/redteam_loop.sh``): the bot, its trusted re-exec, the runner, the benchmark's
measuring process and the model worker, on a throwaway repository of this checkout.

A class-level rebinding that once broke the fp32 reference along with the model is `refused`;
an attention zeroed on the patched instance only is `incorrect` (scored outside the worker),
where a CPU verdict used to be an unconditional `inconclusive`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "judge" / "redteam_loop.sh"
BENCH = ["--model-key", "tiny-qwen3", "--device", "cpu", "--input-length", "16"]
BENCH += ["--output-length", "4", "--timed-runs", "2", "--warmup-runs", "1"]

pytestmark = pytest.mark.slow


def step(out: Path, name: str) -> dict:
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "CUDA_VISIBLE_DEVICES": "",
        "HF_HUB_OFFLINE": "1",
    }
    r = subprocess.run(
        ["bash", str(SCRIPT), str(out), name, *BENCH],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    text = (out / f"{name}.decision.json").read_text()
    assert text.strip(), r.stdout + (out / f"{name}.stderr").read_text()
    return json.loads(text)


def test_planted_experiments_through_the_loop_on_a_cpu(tmp_path):
    out = tmp_path / "out"
    assert step(out, "baseline")["status"] == "keep"  # main's reference row
    rebind = step(out, "class-rebind")
    assert rebind["status"] == "refused", rebind
    assert rebind["ledger_status"] == "discard"
    assert "Qwen3Attention.forward" in " ".join(rebind["reasons"])
    zero = step(out, "zero-attention")
    assert zero["status"] == "incorrect", zero
    ledger = (out / "ledger.md").read_text()
    assert "[refused]" in ledger and "[incorrect]" in ledger
