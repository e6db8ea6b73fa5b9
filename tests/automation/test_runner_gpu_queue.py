"""Per-GPU locks and the queue server: real threads, real processes, real stand-in benches."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from runner_fixtures import make_fake_repo
from tilegym_bot.runner.base import BenchRequest
from tilegym_bot.runner.cli import main
from tilegym_bot.runner.gpulock import GpuLockedExecutor, gpu_lock
from tilegym_bot.runner.jobqueue import RequestError, claim_next, parse_request
from tilegym_bot.runner.local import LocalExecutor

GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
GPU_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"


@pytest.fixture(scope="module")
def fake_repo(tmp_path_factory):
    return make_fake_repo(tmp_path_factory.mktemp("checkout"))


def intervals(record: Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()]


def assert_disjoint(spans: list[dict]) -> None:
    spans = sorted(spans, key=lambda s: s["start"])
    for earlier, later in zip(spans, spans[1:], strict=False):
        assert earlier["end"] <= later["start"], (earlier, later)


def test_two_threads_on_one_gpu_never_overlap(fake_repo, tmp_path):
    repo, sha = fake_repo
    record = tmp_path / "record.jsonl"
    executor = GpuLockedExecutor(LocalExecutor(), tmp_path / "locks")
    results = {}

    def call(name: str) -> None:
        req = BenchRequest(
            repo, sha, ["--model-key", "interval", "--sleep", "0.4", "--record", str(record)],
            tmp_path / f"{name}.json", tmp_path / f"logs-{name}", gpu_uuid=GPU_A,
        )  # fmt: skip
        results[name] = executor.run(req)

    threads = [threading.Thread(target=call, args=(n,)) for n in ("one", "two")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert {r.status for r in results.values()} == {"ok"}
    spans = intervals(record)
    assert len(spans) == 2 and {s["gpu"] for s in spans} == {GPU_A}
    assert_disjoint(spans)


def test_two_processes_benchmarking_on_one_gpu_never_overlap(fake_repo, tmp_path):
    """Two concurrent ``tilegym-bot runner bench`` processes sharing one GPU UUID."""
    repo, sha = fake_repo
    record = tmp_path / "record.jsonl"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tilegym_bot.runner.cli",
                "runner",
                "bench",
                "--repo",
                str(repo),
                "--commit",
                sha,
                "--gpu-uuid",
                GPU_A,
                "--lock-dir",
                str(tmp_path / "locks"),
                "--metrics-out",
                str(tmp_path / f"{i}.json"),
                "--",
                "--model-key",
                "interval",
                "--sleep",
                "0.4",
                "--record",
                str(record),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert all(": ok (exit 0" in out for out in outputs), outputs
    assert_disjoint(intervals(record))


def test_locks_of_different_gpus_are_independent(tmp_path):
    both_inside = threading.Barrier(2, timeout=5)

    def hold(uuid: str) -> None:
        with gpu_lock(uuid, tmp_path):
            both_inside.wait()  # breaks (BrokenBarrierError) if the locks were one lock

    threads = [threading.Thread(target=hold, args=(u,)) for u in (GPU_A, GPU_B)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not both_inside.broken


def test_claims_follow_name_order_and_each_file_once(tmp_path):
    for name in ("20-b.json", "10-a.json", "30-c.json"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "notes.txt").write_text("not a request")
    claimed = [claim_next(tmp_path) for _ in range(4)]
    assert [p.name if p else None for p in claimed] == ["10-a.json", "20-b.json", "30-c.json", None]
    assert sorted(p.name for p in (tmp_path / "running").iterdir()) == [
        "10-a.json", "20-b.json", "30-c.json",
    ]  # fmt: skip


VALID = {
    "repo_dir": "checkout",
    "commit": "a" * 40,
    "bench_args": ["--model-key", "qwen3"],
    "metrics_out": "out/head.json",
    "log_dir": "logs",
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"commit": "A" * 40}, "commit must be 40 lowercase hex"),
        ({"bench_args": "--model-key qwen3"}, "bench_args must be a list"),
        ({"timeout_s": 0}, "timeout_s must be a positive"),
        ({"timeout_s": True}, "timeout_s must be a positive"),
        ({"gpu_uuid": GPU_A}, "unknown keys: gpu_uuid"),
        ({"log_dir": ""}, "log_dir must be a non-empty"),
    ],
)
def test_bad_requests_are_refused_with_a_reason(change, message):
    with pytest.raises(RequestError, match=message):
        parse_request({**VALID, **change}, Path("/q"))


def test_requests_resolve_relative_paths_against_the_queue():
    req = parse_request(dict(VALID, timeout_s=60), Path("/q"))
    assert req.repo_dir == Path("/q/checkout") and req.metrics_out == Path("/q/out/head.json")
    assert req.timeout_s == 60.0 and req.gpu_uuid is None
    with pytest.raises(RequestError, match="missing keys: commit"):
        parse_request({k: v for k, v in VALID.items() if k != "commit"}, Path("/q"))


def test_serve_once_drains_the_queue_one_job_per_gpu_at_a_time(fake_repo, tmp_path, capsys):
    repo, sha = fake_repo
    queue, record = tmp_path / "queue", tmp_path / "record.jsonl"
    queue.mkdir()
    for i in range(4):
        doc = {
            "repo_dir": str(repo), "commit": sha, "metrics_out": f"out/{i}.json",
            "log_dir": f"logs/{i}", "timeout_s": 60,
            "bench_args": ["--model-key", "interval", "--sleep", "0.2", "--record", str(record)],
        }  # fmt: skip
        (queue / f"job-{i}.json").write_text(json.dumps(doc))
    (queue / "job-9.json").write_text('{"commit": "nope"}')
    code = main(["runner", "serve", "--gpus", f"{GPU_A},{GPU_B}", "--queue", str(queue),
                 "--once", "--lock-dir", str(tmp_path / "locks")])  # fmt: skip
    assert code == 0
    done = sorted(p.name for p in (queue / "done").iterdir())
    assert done == [f"job-{i}.json" for i in range(4)]
    for name in done:
        rec = json.loads((queue / "done" / name).read_text())
        assert rec["result"]["status"] == "ok"
        assert rec["request"]["gpu_uuid"] in (GPU_A, GPU_B)
    assert (queue / "failed" / "job-9.json").is_file()
    error = (queue / "failed" / "job-9.json.error").read_text()
    assert "job-9.json:1: QUEUE001 missing keys" in error
    assert not list(queue.glob("*.json")) and not list((queue / "running").iterdir())
    spans = intervals(record)
    assert len(spans) == 4
    for gpu in (GPU_A, GPU_B):
        assert_disjoint([s for s in spans if s["gpu"] == gpu])
    assert "QUEUE001" in capsys.readouterr().out


def test_serve_refuses_a_gpu_listed_twice(tmp_path, capsys):
    assert main(["runner", "serve", "--gpus", f"{GPU_A},{GPU_A}", "--queue", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "error: --gpus lists a GPU twice"


def test_sigterm_lets_the_running_job_finish_and_takes_no_new_one(fake_repo, tmp_path):
    repo, sha = fake_repo
    queue, record = tmp_path / "queue", tmp_path / "record.jsonl"
    queue.mkdir()
    for i in range(2):
        doc = {
            "repo_dir": str(repo), "commit": sha, "metrics_out": f"out/{i}.json",
            "log_dir": f"logs/{i}",
            "bench_args": ["--model-key", "interval", "--sleep", "1.0", "--record", str(record)],
        }  # fmt: skip
        (queue / f"job-{i}.json").write_text(json.dumps(doc))
    server = subprocess.Popen(
        [sys.executable, "-m", "tilegym_bot.runner.cli", "runner", "serve", "--gpus", GPU_A,
         "--queue", str(queue), "--poll", "0.1", "--lock-dir", str(tmp_path / "locks")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not (queue / "running" / "job-0.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    server.send_signal(signal.SIGTERM)
    out = server.communicate(timeout=60)[0]
    assert server.returncode == 0, out
    assert [p.name for p in (queue / "done").iterdir()] == ["job-0.json"]
    assert (queue / "job-1.json").is_file()  # still queued for the next server


def test_a_lock_wait_that_gives_up_puts_the_job_back(fake_repo, tmp_path, monkeypatch, capsys):
    """Another process holds the GPU past TILEGYM_GPU_LOCK_TIMEOUT: the worker survives, the
    job returns to the queue untouched and runs once the GPU is free."""
    repo, sha = fake_repo
    queue, locks = tmp_path / "queue", tmp_path / "locks"
    queue.mkdir()
    doc = {
        "repo_dir": str(repo), "commit": sha, "metrics_out": "out/0.json", "log_dir": "logs/0",
        "timeout_s": 60,
        "bench_args": ["--model-key", "interval", "--sleep", "0.1", "--record",
                       str(tmp_path / "record.jsonl")],
    }  # fmt: skip
    (queue / "job-0.json").write_text(json.dumps(doc))
    monkeypatch.setenv("TILEGYM_GPU_LOCK_TIMEOUT", "0.5")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom tilegym_bot.runner.gpulock import gpu_lock\n"
         f"with gpu_lock({GPU_A!r}, __import__('pathlib').Path({str(locks)!r}), 30):\n"
         "    print('held', flush=True)\n    time.sleep(3)\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        code = main(["runner", "serve", "--gpus", GPU_A, "--queue", str(queue), "--once",
                     "--lock-dir", str(locks)])  # fmt: skip
    finally:
        holder.wait(timeout=30)
    assert code == 0
    assert (queue / "done" / "job-0.json").is_file()
    out = capsys.readouterr().out
    assert "job-0.json on " + GPU_A + ": requeued: " in out
    assert f"job-0.json on {GPU_A}: ok" in out
