"""Waiting for a GPU lock: it says whose lock it waits for, gives up after a stated time with
one ``error:`` line, and a CPU run takes no GPU lock. Real processes hold the locks; the
benchmarks run through ``tilegym-bot runner bench`` as real subprocesses."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from runner_fixtures import make_fake_repo
from tilegym_bot.runner.gpulock import holder_path, lock_path, needs_gpu_lock

GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
HOLDER_COMMIT = "ab" * 20

HOLD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tilegym_bot.runner.gpulock import gpu_lock

    uuid, lock_dir, seconds = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
    with gpu_lock(uuid, lock_dir, holder={"commit": sys.argv[4]}):
        print("held", flush=True)
        time.sleep(seconds)
    print("released", flush=True)
    """
)


@pytest.fixture(scope="module")
def fake_repo(tmp_path_factory):
    return make_fake_repo(tmp_path_factory.mktemp("checkout"))


@pytest.fixture
def hold(tmp_path):
    """Start a process that holds a GPU lock for ``seconds``; it is stopped after the test."""
    started = []

    def start(uuid: str, seconds: float) -> subprocess.Popen:
        args = [uuid, str(tmp_path / "locks"), str(seconds), HOLDER_COMMIT]
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, *args],
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait(timeout=30)


def bench(fake_repo, tmp_path, *bench_args, gpu=GPU_A, env=None, timeout=120):
    repo, sha = fake_repo
    cmd = [sys.executable, "-m", "tilegym_bot", "runner", "bench", "--repo", str(repo)]
    cmd += ["--commit", sha, "--lock-dir", str(tmp_path / "locks")]
    cmd += ["--metrics-out", str(tmp_path / "m.json")]
    cmd += ["--gpu-uuid", gpu] if gpu else []
    cmd += ["--", "--model-key", "ok", *bench_args]
    t0 = time.monotonic()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
    return proc, time.monotonic() - t0


def test_a_wait_names_the_holder_then_gives_up_with_one_error_line(fake_repo, tmp_path, hold):
    holder = hold(GPU_A, 120)
    lock = lock_path(tmp_path / "locks", GPU_A)
    info = json.loads(holder_path(lock).read_text())
    assert info["pid"] == holder.pid and info["commit"] == HOLDER_COMMIT
    assert info["host"] and info["started_at"] and "-c" in info["command"]

    proc, elapsed = bench(fake_repo, tmp_path, env={"TILEGYM_GPU_LOCK_TIMEOUT": "1.5"})
    assert proc.returncode == 1, proc.stderr
    assert elapsed < 60
    err = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr
    waits = [line for line in err if line.startswith("waiting for the GPU lock")]
    assert len(waits) == 1
    assert re.fullmatch(
        rf"waiting for the GPU lock {re.escape(str(lock))} held by pid {holder.pid} "
        rf"\(host .+, `.+`, commit {HOLDER_COMMIT[:8]}\) since \S+; "
        r"giving up after 1\.5 s \(TILEGYM_GPU_LOCK_TIMEOUT\)",
        waits[0],
    ), waits[0]
    assert err[-1].startswith(
        f"error: gave up after 1.5 s waiting for the GPU lock {lock}, still held by "
        f"pid {holder.pid} "
    )
    assert "nothing was run" in err[-1]
    assert not (tmp_path / "m.json").exists()  # nothing ran, so nothing is recorded


def test_a_wait_ends_when_the_holder_lets_go(fake_repo, tmp_path, hold):
    holder = hold(GPU_A, 8.0)  # outlasts the bench's start even on a busy machine, so it waits
    proc, _ = bench(fake_repo, tmp_path, env={"TILEGYM_GPU_LOCK_TIMEOUT": "60"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("waiting for the GPU lock") == 1
    assert f"held by pid {holder.pid}" in proc.stderr
    assert holder_path(lock_path(tmp_path / "locks", GPU_A)).read_text() == ""  # released


@pytest.mark.parametrize(
    ("bench_args", "gpu", "env"),
    [
        (["--device", "cpu"], None, {}),
        (["--device=cpu"], GPU_A, {}),
        ([], None, {"CUDA_VISIBLE_DEVICES": ""}),
    ],
    ids=["device-cpu", "device-cpu-pinned", "auto-without-a-visible-gpu"],
)
def test_a_cpu_run_takes_no_gpu_lock(fake_repo, tmp_path, hold, bench_args, gpu, env):
    hold(gpu or "unpinned", 120)
    proc, elapsed = bench(
        fake_repo, tmp_path, *bench_args, gpu=gpu, env={"TILEGYM_GPU_LOCK_TIMEOUT": "60", **env}
    )
    assert proc.returncode == 0, proc.stderr
    assert "waiting for the GPU lock" not in proc.stderr
    assert elapsed < 50  # did not wait out the 60 s


def test_which_runs_need_the_gpu_lock():
    assert needs_gpu_lock(["--device", "cuda"]) and needs_gpu_lock(["--device=cuda:1"])
    assert needs_gpu_lock([], GPU_A)
    assert not needs_gpu_lock(["--device", "cpu"], GPU_A)


@pytest.mark.parametrize("value", ["soon", "-5", "nan"])
def test_a_bad_lock_timeout_is_one_error_line(fake_repo, tmp_path, hold, value):
    hold(GPU_A, 120)
    proc, _ = bench(fake_repo, tmp_path, env={"TILEGYM_GPU_LOCK_TIMEOUT": value})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: TILEGYM_GPU_LOCK_TIMEOUT must be a number of seconds >= 0 "
        f"(inf: wait forever), got {value!r}"
    ]


def test_the_lock_folder_keeps_no_holder_after_release(tmp_path):
    from tilegym_bot.runner.gpulock import gpu_lock

    with gpu_lock(GPU_A, tmp_path, holder={"commit": HOLDER_COMMIT}) as path:
        assert json.loads(holder_path(Path(path)).read_text())["pid"] == os.getpid()
    assert holder_path(Path(path)).read_text() == ""
