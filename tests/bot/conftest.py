"""Metrics documents for the bot tests: valid ``tilegym-bench-metrics/1`` files, varied per test."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import sys
from pathlib import Path

import git
import pytest
from cuda.tile.compilation import (
    ArrayConstraint,
    CallingConvention,
    KernelSignature,
    mangle_kernel_name,
)

LOOP_MODEL_DIR = "src/tilegym/transformers/qwen3"
SHA_BASE = "a" * 40
SHA_HEAD = "b" * 40
TOTAL_GPU_MS = 1000.0


def cutile_symbol(function: str) -> str:
    """The symbol cuTile gives a launch of ``function`` (one bf16 2-D array argument)."""
    import cuda.tile as ct

    array = ArrayConstraint(
        ct.bfloat16,
        2,
        index_dtype=ct.int32,
        stride_lower_bound_incl=0,
        alias_groups=[],
        may_alias_internally=False,
    )
    sig = KernelSignature([array], CallingConvention.cutile_python_v2())
    return mangle_kernel_name(function, sig)


CUTILE_RMS = cutile_symbol("rms_norm_kernel")


def kernel_list(coverage: float, total_ms: float = TOTAL_GPU_MS) -> list[dict]:
    """A profiled kernel list whose cuTile share is ``coverage`` percent of ``total_ms``."""
    cutile_ms = total_ms * coverage / 100.0
    rest = total_ms - cutile_ms
    return [
        {
            "name": "ampere_bf16_gemm",
            "calls": 56,
            "gpu_ms": 0.7 * rest,
            "cutile": False,
            "module": "Qwen3MLP",
        },
        {
            "name": CUTILE_RMS,
            "calls": 57,
            "gpu_ms": cutile_ms,
            "cutile": True,
            "module": "Qwen3RMSNorm",
        },
        {
            "name": "elementwise_kernel",
            "calls": 300,
            "gpu_ms": 0.3 * rest,
            "cutile": False,
            "module": None,
        },
    ]


def throughput_block(samples, *, interleaved=None):
    tp = {
        "samples": list(samples),
        "mean": sum(samples) / len(samples) if samples else None,
        "std": None,
        "ci95": None,
    }
    if interleaved is not None:
        tp["interleaved"] = interleaved
    return {
        "throughput": tp,
        "ttft_ms": {"samples": [12.5, 13.0], "mean": 12.75},
        "decode_tokens_per_s": {"samples": [50.0, 52.0], "mean": 51.0},
    }


def metrics(
    *,
    commit=SHA_HEAD,
    status="ok",
    coverage=50.0,
    cutile=(50.0, 51.0, 49.0, 50.5, 49.5),
    baseline=(25.0, 25.5, 24.5, 25.2, 24.8),
    interleaved=None,
    passed=True,
    gpu="NVIDIA H200",
    model_key="qwen3",
    kernels=None,
):
    """A schema-valid metrics document; every argument varies one thing a rule looks at."""
    doc = {
        "schema": "tilegym-bench-metrics/1",
        "status": status,
        "error": None if status == "ok" else f"benchmark {status}",
        "model_key": model_key,
        "model_id": "Qwen/Qwen3-0.6B",
        "weights": "random",
        "commit": commit,
        "started_at": "2026-11-29T18:00:00Z",
        "wall_s": 120.0,
        "env": {
            "gpu_name": gpu,
            "gpu_uuid": "GPU-1234",
            "compute_capability": "9.0",
            "driver": "580.65",
            "cuda": "13.0",
            "torch": "2.11.0",
            "transformers": "5.17.0",
            "cuda_tile": "1.7.0",
            "tileiras": "13.4",
            "python": "3.11.9",
        },
        "workload": {
            "name": "default",
            "batch_size": 1,
            "input_length": 128,
            "output_length": 128,
            "warmup_runs": 2,
            "timed_runs": 5,
            "seed": 0,
        },
        "baseline": None,
        "cutile": None,
        "coverage": None,
        "correctness": None,
    }
    if status != "ok":
        return doc
    if baseline is not None:
        doc["baseline"] = throughput_block(baseline, interleaved=interleaved)
    if cutile is not None:
        doc["cutile"] = throughput_block(cutile, interleaved=interleaved)
    if coverage is not None:
        doc["coverage"] = {
            "gpu_time_pct": coverage,
            "launch_pct": min(100.0, coverage + 5) if coverage == coverage else coverage,
            "total_gpu_ms": 1000.0,
            "profiler": "torch",
            "kernels": kernels
            if kernels is not None
            else kernel_list(coverage if math.isfinite(coverage) else 50.0),
        }
    if passed is not None:
        doc["correctness"] = {
            "passed": passed,
            "logits_rel_err": 0.004 if passed else 0.2,
            "baseline_rel_err": 0.003,
            "tolerance": 0.006,
            "top1_agreement": 0.99,
        }
    return doc


def write_metrics(path: Path, doc) -> Path:
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def make_metrics():
    return lambda **kw: copy.deepcopy(metrics(**kw))


@pytest.fixture
def save_metrics():
    return write_metrics


@pytest.fixture(scope="session")
def replay_script():
    """``scripts/replay_decisions.py`` as a module (a script, not a package member)."""
    path = Path(__file__).resolve().parents[2] / "scripts" / "replay_decisions.py"
    spec = importlib.util.spec_from_file_location("replay_decisions", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    r = git.Repo.init(root, initial_branch="main")
    with r.config_writer() as cfg:
        cfg.set_value("user", "name", "Test")
        cfg.set_value("user", "email", "test@example.com")
    (root / "sandbox").mkdir()
    (root / "sandbox" / ".gitignore").write_text("*\n!.gitignore\n")
    (root / LOOP_MODEL_DIR).mkdir(parents=True)
    (root / LOOP_MODEL_DIR / "modeling.py").write_text("# model glue\n")
    (root / LOOP_MODEL_DIR / "kernels").mkdir()
    # the cuTile kernel behind CUTILE_RMS in the metrics documents: what the bot's coverage
    # recount finds by parsing the benchmarked commits
    (root / LOOP_MODEL_DIR / "kernels" / "rms_norm.py").write_text(
        "import cuda.tile as ct\n\n\n@ct.kernel\ndef rms_norm_kernel(x):\n    pass\n"
    )
    (root / "README.md").write_text("readme\n")
    r.index.add(
        [
            "sandbox/.gitignore",
            f"{LOOP_MODEL_DIR}/modeling.py",
            f"{LOOP_MODEL_DIR}/kernels/rms_norm.py",
            "README.md",
        ]
    )
    r.index.commit("initial")
    return r
