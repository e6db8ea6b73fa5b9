"""Any model gets a baseline-only run: a model type with no cuTile patch is still measured on
the PyTorch side (and profiled on a GPU: 0% coverage plus the map of its largest kernels)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from tilegym_hf_bench.metrics_schema import validation_errors
from transformers import MistralConfig, MistralForCausalLM

COMMIT = "0123456789abcdef0123456789abcdef01234567"
FAST = ["--input-length", "16", "--output-length", "4", "--timed-runs", "2", "--warmup-runs", "1"]


@pytest.fixture(scope="module")
def tiny_mistral(tmp_path_factory):
    """A small random Mistral checkpoint on disk (a model type this project has no patch for)."""
    config = MistralConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-mistral")
    MistralForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    return path


def bench(*args, device="cpu", timeout=180):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run(
        [sys.executable, "-m", "tilegym_hf_bench._cli", "--device", device, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_an_unpatched_model_type_is_measured_on_the_pytorch_side(tiny_mistral, tmp_path):
    out = tmp_path / "m.json"
    r = bench("--model-key", "mistral", "--model-id", str(tiny_mistral), "--metrics-out",
              str(out), "--commit", COMMIT, *FAST)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cuTile patch not applied: no patch for model type 'mistral'" in r.stdout
    doc = json.loads(out.read_text())
    assert validation_errors(doc) == [] and doc["status"] == "ok"
    assert doc["cutile"] is None and len(doc["baseline"]["throughput"]["samples"]) == 2
    assert doc["correctness"]["passed"] and doc["correctness"]["logits_rel_err"] is None


@pytest.mark.gpu
def test_on_a_gpu_the_unpatched_model_is_profiled(tiny_mistral, tmp_path):
    out = tmp_path / "m.json"
    r = bench("--model-key", "mistral", "--model-id", str(tiny_mistral), "--metrics-out",
              str(out), "--commit", COMMIT, *FAST, device="cuda")  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert ">>> cuTile Kernel Coverage (GPU Time):    0.00% <<<" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["cutile"] is None and doc["coverage"]["gpu_time_pct"] == 0.0
    modules = {k["module"] for k in doc["coverage"]["kernels"]}
    assert any(m and "mlp" in m for m in modules)  # the map: kernels by the module that ran them
