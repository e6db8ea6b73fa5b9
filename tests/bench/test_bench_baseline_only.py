"""Any model gets a baseline-only run: a model type with no cuTile patch is still measured on
the PyTorch side (and profiled on a GPU: 0% coverage plus the map of its largest kernels), from a
checkpoint directory or from a preset's random weights."""

import json
import os
import subprocess
import sys

import pytest
import torch
from tilegym_hf_bench.metrics_schema import validation_errors
from tilegym_hf_bench.presets import PRESETS
from tilegym_hf_bench.tilegym_patch import MODEL_PATCH_KWARGS
from transformers import AutoConfig, AutoModelForCausalLM

COMMIT = "0123456789abcdef0123456789abcdef01234567"
FAST = ["--input-length", "16", "--output-length", "4", "--timed-runs", "2", "--warmup-runs", "1"]
# the tiny presets of model types MODEL_PATCH_KWARGS has no flags for (yet)
UNPATCHED = sorted(
    k for k, p in PRESETS.items() if p.cpu_sized and p.model_type not in MODEL_PATCH_KWARGS
)


# OLMo 1's layers (Llama's with LayerNorms without weights and clipped q/k/v), shrunk: a model
# type no family patches, whatever tiny presets exist
UNPATCHED_MODEL = dict(
    model_type="olmo",
    hidden_size=64,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    clip_qkv=8.0,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


@pytest.fixture(scope="module")
def unpatched(tmp_path_factory):
    """(model key, model type, checkpoint directory): a small random checkpoint on disk of a
    model type this project has no patch for (OLMo 1)."""
    assert UNPATCHED_MODEL["model_type"] not in MODEL_PATCH_KWARGS
    config = AutoConfig.for_model(**UNPATCHED_MODEL)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("olmo")
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(path)
    return "olmo", "olmo", path


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


@pytest.mark.slow
def test_an_unpatched_model_type_is_measured_on_the_pytorch_side(unpatched, tmp_path):
    key, model_type, path = unpatched
    out = tmp_path / "m.json"
    r = bench("--model-key", key, "--model-id", str(path), "--metrics-out",
              str(out), "--commit", COMMIT, *FAST)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"cuTile patch not applied: no patch for model type {model_type!r}" in r.stdout
    doc = json.loads(out.read_text())
    assert validation_errors(doc) == [] and doc["status"] == "ok"
    assert doc["cutile"] is None and len(doc["baseline"]["throughput"]["samples"]) == 2
    assert doc["correctness"]["passed"] and doc["correctness"]["logits_rel_err"] is None


@pytest.mark.parametrize("key", UNPATCHED)
def test_an_unpatched_tiny_preset_runs_baseline_only_from_random_weights(key, tmp_path):
    out = tmp_path / "m.json"
    r = bench("--model-key", key, "--metrics-out", str(out), "--commit", COMMIT, *FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    model_type = PRESETS[key].model_type
    assert f"cuTile patch not applied: no patch for model type {model_type!r}" in r.stdout
    assert "weights: random" in r.stdout
    doc = json.loads(out.read_text())
    assert validation_errors(doc) == [] and doc["status"] == "ok" and doc["model_key"] == key
    assert doc["cutile"] is None and len(doc["baseline"]["throughput"]["samples"]) == 2
    assert doc["correctness"]["passed"]


@pytest.mark.gpu
def test_on_a_gpu_the_unpatched_model_is_profiled(unpatched, tmp_path):
    key, _, path = unpatched
    out = tmp_path / "m.json"
    r = bench("--model-key", key, "--model-id", str(path), "--metrics-out",
              str(out), "--commit", COMMIT, *FAST, device="cuda")  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert ">>> cuTile Kernel Coverage (GPU Time):    0.00% <<<" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["cutile"] is None and doc["coverage"]["gpu_time_pct"] == 0.0
    modules = {k["module"] for k in doc["coverage"]["kernels"]}
    assert any(m and "mlp" in m for m in modules)  # the map: kernels by the module that ran them
