"""The README's loop, as written, on a machine without a GPU: the tiny preset on the CPU, said
up front, an honest inconclusive that asks for no rerun, and `n/a` for what was not measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bot_local_loop import BENCH_TEMPLATE, _cli, _commit, _ledger, _records, _with_bench
from tilegym_bot.runner.gpulock import host_has_nvidia_gpu

pytestmark = pytest.mark.skipif(host_has_nvidia_gpu(), reason="this host has an NVIDIA GPU")


def test_the_loop_as_written_takes_the_tiny_preset_and_decides_honestly(repo, make_metrics, capsys):
    cpu_doc = make_metrics(gpu=None, coverage=None)  # what a CPU run reports: no GPU, no coverage
    _with_bench(repo, cpu_doc)
    _cli(repo, "experiment", "start", "--model-key", "qwen3", "--name", "fused-rmsnorm")
    head = _commit(repo, {BENCH_TEMPLATE: json.dumps(cpu_doc | {"wall_s": 1.0})}, "kernel")
    capsys.readouterr()
    assert _cli(repo, "experiment", "run", "--description", "fused add+RMSNorm") == 0
    out = capsys.readouterr()
    first = out.err.splitlines()[0]
    assert first.startswith("tilegym-bot: no CUDA GPU here: benchmarking the tiny-qwen3 preset")
    assert "--model-key tiny-qwen3 --device cpu" in out.err  # what the runner started
    banners = [line for line in out.err.splitlines() if "] benchmark " in line]
    assert banners and all(line.count("--model-key") == 1 for line in banners), banners
    decision = json.loads(out.out)
    assert decision["status"] == "inconclusive" and decision["rerun"] is False, decision
    assert "without a CUDA GPU" in decision["reasons"][0]
    (record,) = _records(repo)
    assert len(record["history"]) == 1  # no rerun with twice the samples
    row = _ledger(repo)[-1]
    assert row.commit.startswith(head[:8]) and row.coverage is None
    ledger_text = Path(repo.working_tree_dir, "sandbox", "qwen3_results.md").read_text()
    assert f"| {head[:8]} | n/a |" in ledger_text


def test_a_chosen_device_is_left_alone(repo, make_metrics, capsys):
    _with_bench(repo, make_metrics(gpu=None, coverage=None))
    _cli(repo, "experiment", "start", "--model-key", "qwen3", "--name", "chosen")
    capsys.readouterr()
    assert _cli(repo, "experiment", "run", "--description", "x", "--", "--device", "cpu") == 0
    err = capsys.readouterr().err
    assert "no CUDA GPU here" not in err and "tiny-qwen3" not in err
