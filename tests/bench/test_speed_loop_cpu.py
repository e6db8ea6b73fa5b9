"""A model's speed experiments through the real local loop on the CPU
(``benchmarks/loop/speed_loop.sh``): the round's entry passes the experiment-scope hook, the
patched worker runs with the tuning it sets, and the ledger takes both rows. Without a GPU
nothing can be decided (the ops run their references), so the round is ``inconclusive``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "loop" / "speed_loop.sh"
BENCH = ["--model-key", "tiny-qwen3", "--device", "cpu", "--input-length", "16"]
BENCH += ["--output-length", "4", "--timed-runs", "2", "--warmup-runs", "1"]

pytestmark = pytest.mark.slow


def test_the_rope_heads_and_norm_gemv_rounds_through_the_loop_on_a_cpu(tmp_path):
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "CUDA_VISIBLE_DEVICES": "",
        "HF_HUB_OFFLINE": "1",
        "SPEED_ROPE_HEADS": "2",
        "LOOP_ROUNDS": "baseline rope-heads norm-gemv-mlp",
    }
    done = subprocess.run(
        ["bash", str(SCRIPT), str(out), "qwen3", *BENCH],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((out / "baseline.decision.json").read_text())["status"] == "keep"
    decision = json.loads((out / "rope-heads.decision.json").read_text())
    assert decision["status"] == "inconclusive", decision
    assert "without a CUDA GPU" in decision["reasons"][0]
    worker = (out / "rope-heads.stderr").read_text()
    assert "'rope_heads': 2," in worker  # the head's patch took the tuning
    worker = (out / "norm-gemv-mlp.stderr").read_text()
    assert "'norm_gemv': 2," in worker and "'rope_heads': 1," in worker  # main's, not the discard's
    rows = (out / "ledger.md").read_text().splitlines()[2:]
    assert [row.split("|")[4].strip() for row in rows] == ["keep", "discard", "discard"]
    assert "2 head(s) a block [inconclusive]" in rows[1]
    assert "gate/up GEMV's K loop too [inconclusive]" in rows[2]
