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


@pytest.mark.slow
def test_without_a_gpu_it_says_so():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present (the script would profile phi3)")
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2 and done.stderr == "error: needs a CUDA GPU\n"


def test_python_top_ranks_functions_by_self_time_per_token():
    stats = {
        ("/x/transformers/generation/utils.py", 2700, "_sample"): (1, 1, 0.002, 0.5, {}),
        ("/x/torch/_inductor/cudagraph_trees.py", 2236, "_run"): (128, 128, 0.064, 0.3, {}),
        ("~", 0, "<method 'item' of 'torch._C.TensorBase' objects>"): (256, 256, 0.128, 0.1, {}),
    }
    top = _module().python_top(stats, 128, 2)
    assert top == [
        ("<method 'item' of 'torch._C.TensorBase' objects>", 2.0, pytest.approx(1000.0)),
        ("cudagraph_trees.py:2236(_run)", 1.0, pytest.approx(500.0)),
    ]


def test_python_top_of_a_real_generate_on_the_cpu():
    from tilegym_hf_bench.generation import Generator, make_input_ids
    from tilegym_hf_bench.model_factory import random_model

    model = random_model("tiny-qwen3", "cpu", seed=0).model
    gen = Generator(model, make_input_ids(model.config.vocab_size, 1, 8, 0, "cpu"), "cpu")
    top = _module().profile_python(gen, 4, 5)
    assert len(top) == 5 and all(calls > 0 and us >= 0 for _, calls, us in top)
    assert [us for *_, us in top] == sorted((us for *_, us in top), reverse=True)
