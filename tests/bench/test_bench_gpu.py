"""The benchmark on a real GPU (skipped without one): both sides, correctness and coverage."""

import json
import os
import subprocess
import sys

import pytest
from tilegym_hf_bench.metrics_schema import validation_errors

pytestmark = pytest.mark.gpu


def test_tiny_preset_on_gpu_measures_both_sides_and_coverage(tmp_path):
    out = tmp_path / "m.json"
    r = subprocess.run(
        [sys.executable, "-m", "tilegym_hf_bench._cli", "--model-key", "tiny-qwen3",
         "--device", "cuda", "--metrics-out", str(out), "--commit", "c" * 40,
         "--input-length", "100", "--output-length", "12", "--timed-runs", "3"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert validation_errors(doc) == []
    assert doc["env"]["gpu_name"] and doc["env"]["compute_capability"]
    assert (
        doc["baseline"]["throughput"]["interleaved"] and doc["cutile"]["throughput"]["interleaved"]
    )
    assert doc["correctness"]["passed"], doc["correctness"]
    cov = doc["coverage"]
    assert cov["total_gpu_ms"] > 0 and cov["kernels"]
    attributed = sum(k["gpu_ms"] for k in cov["kernels"] if k["module"] is not None)
    assert attributed >= 0.5 * cov["total_gpu_ms"]  # most GPU time has its launching module
    # cuTile kernels too (they have no launching op: attributed through their driver call)
    cutile = [k for k in cov["kernels"] if k["cutile"]]
    assert cutile and sum(k["gpu_ms"] for k in cutile if k["module"] is not None) >= 0.9 * sum(
        k["gpu_ms"] for k in cutile
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(">>> cuTile Kernel Coverage")]
    assert lines == [f">>> cuTile Kernel Coverage (GPU Time):    {cov['gpu_time_pct']:.2f}% <<<"]
