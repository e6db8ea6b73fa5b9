"""The decode weight-read floor: which bytes a batch-1 decode token must read, from plain data,
and the script's floor table on any machine."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks/e2e/decode_roofline.py"


@pytest.fixture(scope="module")
def roofline():
    spec = importlib.util.spec_from_file_location("decode_roofline", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


DENSE = [
    ("model.embed_tokens.weight", (1000, 64)),
    ("model.layers.0.self_attn.q_proj.weight", (64, 64)),
    ("model.layers.0.input_layernorm.weight", (64,)),
    ("lm_head.weight", (1000, 64)),
]


def test_an_untied_embedding_reads_one_row_and_lm_head_reads_all(roofline):
    got = roofline.weight_bytes_per_token(DENSE, hidden=64, tied=False)
    assert got == 2 * (64 + 64 * 64 + 64 + 1000 * 64)


def test_a_tied_embedding_is_read_whole_once(roofline):
    tied = DENSE[:3]  # the tied lm_head is the embedding's parameter, listed once
    assert roofline.weight_bytes_per_token(tied, hidden=64, tied=True) == 2 * (
        1000 * 64 + 64 * 64 + 64
    )


def test_only_the_top_k_experts_count_packed_or_per_expert(roofline):
    packed = [
        ("model.layers.0.mlp.gate.weight", (8, 64)),  # the router: read whole
        ("model.layers.0.mlp.experts.gate_up_proj", (8, 256, 64)),
        ("model.layers.0.mlp.experts.down_proj", (8, 64, 128)),
    ]
    got = roofline.weight_bytes_per_token(packed, hidden=64, tied=False, experts=(2, 8))
    assert got == 2 * (8 * 64 + (8 * 256 * 64 + 8 * 64 * 128) // 4)
    per_expert = [(f"model.layers.0.mlp.experts.{e}.w1.weight", (128, 64)) for e in range(8)]
    got = roofline.weight_bytes_per_token(per_expert, hidden=64, tied=False, experts=(2, 8))
    assert got == 2 * 2 * 128 * 64


def test_kv_reads_stop_at_a_sliding_window(roofline):
    config = SimpleNamespace(
        num_key_value_heads=2,
        head_dim=16,
        hidden_size=64,
        num_attention_heads=4,
        num_hidden_layers=4,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        sliding_window=100,
    )
    per_position = 2 * 2 * 16 * 2  # K and V, 2 heads of 16, bf16
    assert roofline.kv_bytes_per_token(config, 1000) == per_position * (3 * 100 + 1000)
    config.sliding_window = None
    assert roofline.kv_bytes_per_token(config, 1000) == per_position * 4000


def _run(*args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), str(ROOT / "modeling/transformers/src"), env.get("PYTHONPATH", "")]
    )
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_the_floor_table_of_qwen3_needs_no_gpu():
    r = _run("--floor-only", "--model-keys", "qwen3", "qwen3_moe")
    assert r.returncode == 0, r.stderr
    rows = {line.split(" | ")[0].strip("| "): line for line in r.stdout.splitlines()}
    # Qwen3-0.6B: 0.60B parameters with the embedding tied to lm_head, bf16
    assert "| 1.192 GB |" in rows["qwen3"]
    assert "| 0.2988 |" in rows["qwen3"]
    assert "qwen3_moe" in rows
    assert "floor at 4.8 TB/s (H200 HBM3e spec, the target)" in r.stdout


def test_the_floor_follows_the_bandwidth_asked_for():
    r = _run("--floor-only", "--model-keys", "qwen3", "--tbps", "2.4")
    assert r.returncode == 0, r.stderr
    assert "floor at 2.4 TB/s (--tbps)" in r.stdout
    assert "| 0.5976 |" in r.stdout  # twice the 4.8 TB/s floor
    r = _run("--floor-only", "--model-keys", "qwen3", "--tbps", "0")
    assert r.returncode == 2 and r.stderr.strip() == "error: --tbps 0.0: a positive number"


def test_an_unknown_key_is_one_error_line():
    r = _run("--floor-only", "--model-keys", "nope")
    assert r.returncode == 2
    assert r.stderr.strip() == "error: unknown model key(s): nope"
