"""LocalExecutor end to end: a real subprocess of a stand-in bench in a real git checkout."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest
from runner_fixtures import alive, make_fake_repo
from tilegym_bot.runner.base import BenchRequest
from tilegym_bot.runner.local import LocalExecutor
from tilegym_hf_bench.metrics_schema import validation_errors


@pytest.fixture(scope="module")
def fake_repo(tmp_path_factory):
    return make_fake_repo(tmp_path_factory.mktemp("checkout"))


def request(repo, sha, tmp_path, key, *extra, timeout=60.0, gpu=None):
    return BenchRequest(
        repo_dir=repo,
        commit=sha,
        bench_args=["--model-key", key, *extra],
        metrics_out=tmp_path / "out" / "metrics.json",
        log_dir=tmp_path / "logs",
        timeout_s=timeout,
        gpu_uuid=gpu,
    )


def metrics(result):
    doc = json.loads(result.metrics_path.read_text())
    assert validation_errors(doc) == []
    return doc


def test_ok_run_keeps_the_bench_metrics_and_runs_the_checkouts_code(fake_repo, tmp_path):
    repo, sha = fake_repo
    req = request(repo, sha, tmp_path, "ok", gpu="GPU-00000000-1111-2222-3333-444444444444")
    result = LocalExecutor().run(req)
    assert (result.status, result.returncode) == ("ok", 0)
    doc = metrics(result)
    assert doc["status"] == "ok" and doc["commit"] == sha and doc["error"] is None
    out = result.stdout_log.read_text()
    # The checkout's bench ran (not the installed one), pinned to the requested GPU.
    assert str(repo / "modeling/transformers/src/tilegym_hf_bench/_cli.py") in out
    assert "gpu GPU-00000000-1111-2222-3333-444444444444" in out


def test_crash_writes_a_crash_metrics_file_with_the_stderr_tail(fake_repo, tmp_path):
    repo, sha = fake_repo
    result = LocalExecutor().run(request(repo, sha, tmp_path, "crash"))
    assert (result.status, result.returncode) == ("crash", 3)
    doc = metrics(result)
    assert doc["status"] == "crash" and doc["commit"] == sha and doc["model_key"] == "crash"
    assert "exited with status 3" in doc["error"]
    assert "RuntimeError: boom in the kernel" in doc["error"]


@pytest.mark.parametrize(
    ("key", "why"),
    [("garbage", "not JSON"), ("wrongcommit", "not the benchmarked")],
)
def test_exit_zero_without_valid_metrics_is_a_crash(fake_repo, tmp_path, key, why):
    repo, sha = fake_repo
    result = LocalExecutor().run(request(repo, sha, tmp_path, key))
    assert (result.status, result.returncode) == ("crash", 0)
    doc = metrics(result)
    assert doc["status"] == "crash" and why in doc["error"]


def test_timeout_kills_the_whole_process_group(fake_repo, tmp_path):
    repo, sha = fake_repo
    pid_file = tmp_path / "pids"
    req = request(repo, sha, tmp_path, "hang", "--pid-file", str(pid_file), timeout=1.5)
    t0 = time.monotonic()
    result = LocalExecutor(grace_s=0.5).run(req)
    elapsed = time.monotonic() - t0
    assert result.status == "timeout"
    assert result.returncode == -9  # SIGTERM was ignored, so SIGKILL ended it
    assert 1.5 <= elapsed < 10
    leader, grandchild = map(int, pid_file.read_text().split())
    deadline = time.monotonic() + 5
    while (alive(leader) or alive(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(leader) and not alive(grandchild)
    doc = metrics(result)
    assert doc["status"] == "timeout" and "1.5 s limit" in doc["error"]
    assert "hanging on purpose" in doc["error"]


def test_checkout_not_at_the_commit_is_a_crash_without_running(fake_repo, tmp_path):
    repo, _ = fake_repo
    result = LocalExecutor().run(request(repo, "f" * 40, tmp_path, "ok"))
    assert (result.status, result.returncode) == ("crash", None)
    doc = metrics(result)
    assert f"not at the commit to benchmark {'f' * 40}" in doc["error"]
    assert result.stdout_log.read_text() == ""


def test_stale_metrics_from_an_earlier_run_are_not_reused(fake_repo, tmp_path):
    repo, sha = fake_repo
    req = request(repo, sha, tmp_path, "ok")
    LocalExecutor().run(req)
    crashed = LocalExecutor().run(request(repo, sha, tmp_path, "crash"))
    assert crashed.metrics_path == req.metrics_out
    assert metrics(crashed)["status"] == "crash"


TINY_CPU_ARGS = [
    "--model-key", "tiny-qwen3", "--device", "cpu",
    "--warmup-runs", "0", "--timed-runs", "2", "--input-length", "8", "--output-length", "4",
]  # fmt: skip


def _bench_importable() -> bool:
    src = Path(__file__).resolve().parents[2] / "modeling/transformers/src/tilegym_hf_bench"
    return (src / "_cli.py").is_file()


@pytest.mark.skipif(not _bench_importable(), reason="tilegym_hf_bench._cli is not written yet")
def test_real_tiny_cpu_preset_through_the_executor(tmp_path):
    """The real bench CLI, copied from this working tree into a fresh commit, on the CPU preset."""
    import git

    root = Path(__file__).resolve().parents[2]
    work = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    for rel in ("src", "modeling/transformers/src", "bot", "hooks"):
        if (root / rel).is_dir():
            shutil.copytree(root / rel, work / rel, ignore=ignore)
    repo = git.Repo.init(work)
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "t").set_value("user", "email", "t@example.com")
    repo.git.add("-A")
    repo.index.commit("working tree copy")
    sha = repo.head.commit.hexsha
    req = BenchRequest(
        repo_dir=work,
        commit=sha,
        bench_args=TINY_CPU_ARGS,
        metrics_out=tmp_path / "metrics.json",
        log_dir=tmp_path / "logs",
        timeout_s=300,
    )
    result = LocalExecutor().run(req)
    doc = metrics(result)
    if result.status == "crash" and re.search(r"(ModuleNotFound|Import)Error", doc["error"]):
        pytest.skip(f"the bench in this working tree does not import: {doc['error'][-300:]}")
    assert result.status == "ok", doc["error"]
    assert doc["commit"] == sha and doc["model_key"] == "tiny-qwen3"
    assert doc["baseline"]["throughput"]["samples"]  # measured on CPU; cuTile needs a GPU
    assert "Average throughput" in result.stdout_log.read_text()
