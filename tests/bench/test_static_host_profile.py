"""The static-mode host profile's per-token table, from plain profiler-like rows."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks/e2e/static_host_profile.py"


def _module():
    spec = importlib.util.spec_from_file_location("static_host_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _event(key, count, self_cpu_us):
    return SimpleNamespace(key=key, count=count, self_cpu_time_total=self_cpu_us)


def test_events_fold_into_per_token_columns():
    events = [
        _event("cudaStreamSynchronize", 300, 240_000.0),
        _event("cudaDeviceSynchronize", 20, 8_000.0),
        _event("cudaGraphLaunch", 128, 96_000.0),
        _event("CUDAGraphNode.record (dynamo_timed)", 2, 50_000.0),
        _event("TorchDynamo Cache Lookup", 128, 57_600.0),
        _event("cudaLaunchKernel", 5120, 51_200.0),
        _event("aten::mm", 999, 1.0),
    ]
    table = _module().host_table(events, 128)
    assert table.keys() == {
        "syncs",
        "graph launches",
        "graph recordings",
        "guard checks",
        "eager launches",
    }
    assert table["syncs"] == pytest.approx((320 / 128, 248.0 / 128))
    assert table["graph launches"] == pytest.approx((1.0, 0.75))
    assert table["graph recordings"] == pytest.approx((2 / 128, 50.0 / 128))
    assert table["guard checks"] == pytest.approx((1.0, 0.45))
    assert table["eager launches"] == pytest.approx((40.0, 0.4))


def test_without_a_gpu_it_says_so():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present (the script would profile phi3)")
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2 and done.stderr == "error: needs a CUDA GPU\n"
