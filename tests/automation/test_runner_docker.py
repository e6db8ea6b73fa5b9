"""DockerExecutor through the real docker SDK against a Docker Engine API server on a socket."""

from __future__ import annotations

import json
import os
import time

import docker
import git
import pytest
from docker_api_fake import FakeEngine
from runner_fixtures import make_fake_repo
from tilegym_bot.runner.base import BenchRequest, synthesize_metrics
from tilegym_bot.runner.docker import DockerExecutor
from tilegym_hf_bench.metrics_schema import validation_errors

IMAGE = "tilegym-experiment:test"
GPU = "GPU-5d8e2f3c-0a1b-4c2d-9e8f-001122334455"


@pytest.fixture(scope="module")
def fake_repo(tmp_path_factory):
    return make_fake_repo(tmp_path_factory.mktemp("checkout"))


def ok_metrics(repo, sha):
    probe = BenchRequest(repo, sha, ["--model-key", "qwen3"], repo / "x.json", repo)
    return dict(synthesize_metrics(probe, "ok", "", "2026-01-01T00:00:00+00:00", 3.0), error=None)


def run(
    tmp_path,
    fake_repo,
    behaviour,
    *,
    gpu=GPU,
    images=(IMAGE,),
    timeout=30.0,
    repo=None,
    harness=None,
    seed=(),
    device="cuda",
    **limits,
):
    repo, sha = (repo or fake_repo[0]), fake_repo[1]
    sock = tmp_path / "docker.sock"
    with FakeEngine(sock, set(images), behaviour, ok_metrics(repo, sha)) as engine:
        for labels in seed:
            engine.seed(labels)
        client = docker.DockerClient(base_url=engine.base_url, version="auto", timeout=10)
        request = BenchRequest(
            repo_dir=repo,
            commit=sha,
            bench_args=["--model-key", "qwen3", "--device", device],
            metrics_out=tmp_path / "out" / "head.json",
            log_dir=tmp_path / "logs",
            timeout_s=timeout,
            gpu_uuid=gpu,
            harness_dir=harness,
        )
        executor = DockerExecutor(IMAGE, memory_limit="64g", client=client, grace_s=1.0, **limits)
        t0 = time.monotonic()
        result = executor.run(request)
        elapsed = time.monotonic() - t0
        client.close()
    doc = json.loads(result.metrics_path.read_text())
    assert validation_errors(doc) == []
    return engine, result, doc, elapsed


def test_a_linked_worktree_also_gets_its_git_dir_read_only(tmp_path, fake_repo):
    main, sha = fake_repo
    worktree = tmp_path / "wt"
    git.Repo(main).git.worktree("add", "--detach", str(worktree), sha)
    try:
        engine, result, _, _ = run(tmp_path, fake_repo, "ok", repo=worktree)
    finally:
        git.Repo(main).git.worktree("remove", "--force", str(worktree))
    assert result.status == "ok"
    binds = engine.created[0]["HostConfig"]["Binds"]
    git_dir = (main / ".git").resolve()
    assert f"{worktree.resolve()}:/workspace/repo:ro" in binds
    assert f"{git_dir}:{git_dir}:ro" in binds


def test_create_request_pins_one_gpu_no_network_read_only_repo(tmp_path, fake_repo):
    repo, sha = fake_repo
    engine, result, doc, _ = run(tmp_path, fake_repo, "ok")
    assert (result.status, result.returncode) == ("ok", 0)
    assert doc["commit"] == sha and doc["status"] == "ok"
    [body] = engine.created
    host = body["HostConfig"]
    assert host["DeviceRequests"] == [
        {"Driver": "", "Count": 0, "DeviceIDs": [GPU], "Capabilities": [["gpu"]], "Options": {}}
    ]
    assert f"{repo.resolve()}:/workspace/repo:ro" in host["Binds"]
    [out_bind] = [b for b in host["Binds"] if ":/workspace/out:" in b]
    assert out_bind.endswith(":rw")
    assert host["NetworkMode"] == "none"
    assert host["Memory"] == 64 * 1024**3 and host["MemorySwap"] == 64 * 1024**3
    assert host["CapDrop"] == ["ALL"]
    assert body["Image"] == IMAGE and body["WorkingDir"] == "/workspace/repo"
    assert body["Cmd"][1:3] == ["-m", "tilegym_hf_bench._cli"]
    assert body["Cmd"][-2:] == ["--metrics-out", "/workspace/out/metrics.json"]
    env = dict(e.split("=", 1) for e in body["Env"])
    assert body["Cmd"][body["Cmd"].index("--commit") + 1] == sha
    assert env["PYTHONPATH"].split(":")[0] == "/workspace/repo/src"
    assert body["User"] == f"{os.getuid()}:{os.getgid()}"
    # Logs streamed to files; the container is removed; the temporary out folder is gone.
    assert "Average throughput" in result.stdout_log.read_text()
    assert "warming up" in result.stderr_log.read_text()
    assert engine.call_names()[-1] == "delete" and not engine.containers
    assert not list(result.stdout_log.parent.glob("docker-out-*"))


def test_without_a_gpu_uuid_no_device_is_requested(tmp_path, fake_repo):
    engine, result, _, _ = run(tmp_path, fake_repo, "ok", gpu=None)
    assert result.status == "ok"
    assert not engine.created[0]["HostConfig"].get("DeviceRequests")


def test_timeout_stops_then_kills_then_removes(tmp_path, fake_repo):
    engine, result, doc, elapsed = run(tmp_path, fake_repo, "hang", timeout=1.0)
    assert result.status == "timeout" and result.returncode is None
    assert doc["status"] == "timeout" and "1 s limit" in doc["error"]
    assert "stuck in generate()" in doc["error"]
    names = engine.call_names()
    after_wait = names[names.index("wait") + 1 :]
    lifecycle = [n for n in after_wait if n in ("stop", "kill", "delete")]
    assert lifecycle == ["stop", "kill", "delete"]
    assert not engine.containers
    assert elapsed < 15


def test_crash_keeps_the_exit_status_and_stderr(tmp_path, fake_repo):
    _, result, doc, _ = run(tmp_path, fake_repo, "crash")
    assert (result.status, result.returncode) == ("crash", 1)
    assert "exited with status 1" in doc["error"]
    assert "an illegal memory access" in doc["error"]


def test_out_of_memory_is_named(tmp_path, fake_repo):
    _, result, doc, _ = run(tmp_path, fake_repo, "oom")
    assert (result.status, result.returncode) == ("crash", 137)
    assert "ran out of memory (limit 64g)" in doc["error"]


def test_missing_image_is_a_crash_that_says_how_to_build_it(tmp_path, fake_repo):
    engine, result, doc, _ = run(tmp_path, fake_repo, "ok", images=())
    assert (result.status, result.returncode) == ("crash", None)
    assert f"image {IMAGE} not found" in doc["error"] and "docker build" in doc["error"]
    assert "create" not in engine.call_names()


def make_harness(root):
    """A trusted checkout's harness roots (what --harness needs)."""
    for rel in ("modeling/transformers/src", "bot", "hooks"):
        (root / rel).mkdir(parents=True)
    return root


def test_pids_limit_cpuset_of_the_gpu_and_the_trusted_harness_read_only(tmp_path, fake_repo):
    harness = make_harness(tmp_path / "trusted")
    cpusets = {GPU: "0-7", "GPU-other": "8-15"}
    engine, result, _, _ = run(
        tmp_path, fake_repo, "ok", harness=harness, pids_limit=512, cpusets=cpusets
    )
    assert result.status == "ok"
    [body] = engine.created
    host = body["HostConfig"]
    assert host["PidsLimit"] == 512 and host["CpusetCpus"] == "0-7"
    assert f"{harness.resolve()}:/workspace/harness:ro" in host["Binds"]
    env = dict(e.split("=", 1) for e in body["Env"])
    assert env["PYTHONPATH"].split(":") == [
        "/workspace/repo/src",
        "/workspace/harness/modeling/transformers/src",
        "/workspace/harness/bot",
        "/workspace/harness/hooks",
    ]
    assert body["Labels"]["tilegym.bench"] == "1" and body["Labels"]["tilegym.gpu"] == GPU


def test_defaults_limit_processes_and_leave_the_cpus_alone(tmp_path, fake_repo):
    engine, _, _, _ = run(tmp_path, fake_repo, "ok")
    host = engine.created[0]["HostConfig"]
    assert host["PidsLimit"] == 4096 and not host.get("CpusetCpus")


def test_stale_containers_of_this_gpu_are_removed_before_the_run(tmp_path, fake_repo):
    ours = {"tilegym.bench": "1", "tilegym.gpu": GPU, "tilegym.commit": "0" * 40}
    other_gpu = {"tilegym.bench": "1", "tilegym.gpu": "GPU-other"}
    not_ours = {"tilegym.gpu": GPU}  # no bench label: some other tool's container
    engine, result, _, _ = run(tmp_path, fake_repo, "ok", seed=(ours, other_gpu, not_ours))
    assert result.status == "ok"
    left = [c.labels for c in engine.containers.values()]
    assert sorted(map(str, left)) == sorted(map(str, [other_gpu, not_ours]))
    names = engine.call_names()
    assert names.index("json") < names.index("create")
    assert "removed stale container" in result.stderr_log.read_text()


def test_a_run_without_a_gpu_removes_nothing(tmp_path, fake_repo):
    # CPU runs take no lock and may run side by side: none of them may remove another.
    cpu = {"tilegym.bench": "1", "tilegym.gpu": "none"}
    engine, result, _, _ = run(tmp_path, fake_repo, "ok", gpu=None, seed=(cpu,), device="cpu")
    assert result.status == "ok" and ("GET", "/containers/json") not in engine.calls
    assert [c.labels for c in engine.containers.values()] == [cpu]
    assert engine.created[0]["Labels"]["tilegym.gpu"] == "none"


def test_a_run_that_floods_its_output_folder_is_killed(tmp_path, fake_repo):
    engine, result, doc, elapsed = run(tmp_path, fake_repo, "flood", out_bytes=1024 * 1024)
    assert (result.status, result.returncode) == ("crash", 137)
    assert "wrote more than 1048576 bytes into its output folder" in doc["error"]
    assert "kill" in engine.call_names() and not engine.containers
    assert not list(result.stdout_log.parent.glob("docker-out-*"))
    assert elapsed < 15


def test_log_streams_are_cut_at_their_cap(tmp_path, fake_repo):
    _, result, _, _ = run(tmp_path, fake_repo, "chatty", log_bytes=1024 * 1024)
    assert result.status == "ok"
    text = result.stdout_log.read_bytes()
    assert len(text) < 1024 * 1024 + 100
    assert text.endswith(b"[runner] log cut at 1048576 bytes\n")


def _cli(tmp_path, fake_repo, engine, *extra):
    from tilegym_bot.runner.cli import main

    repo, sha = fake_repo
    return main(
        [
            "runner",
            "bench",
            "--executor",
            "docker",
            "--image",
            IMAGE,
            "--repo",
            str(repo),
            "--commit",
            sha,
            "--gpu-uuid",
            GPU,
            "--metrics-out",
            str(tmp_path / "m.json"),
            "--lock-dir",
            str(tmp_path / "locks"),
            *extra,
            "--",
            "--model-key",
            "qwen3",
        ]
    )


def test_runner_bench_passes_cpuset_pids_and_harness_to_the_container(
    tmp_path, fake_repo, monkeypatch, capsys
):
    harness = make_harness(tmp_path / "base")
    sock = tmp_path / "docker.sock"
    with FakeEngine(sock, {IMAGE}, "ok", ok_metrics(*fake_repo)) as engine:
        monkeypatch.setenv("DOCKER_HOST", engine.base_url)
        monkeypatch.setenv("TILEGYM_CPUSET", f"{GPU}=4-7;GPU-b=8-11")
        rc = _cli(tmp_path, fake_repo, engine, "--pids-limit", "300", "--harness", str(harness))
    assert rc == 0, capsys.readouterr().err
    host = engine.created[0]["HostConfig"]
    assert (host["PidsLimit"], host["CpusetCpus"]) == (300, "4-7")
    assert f"{harness.resolve()}:/workspace/harness:ro" in host["Binds"]


@pytest.mark.parametrize(
    ("extra", "env", "message"),
    [
        (["--cpuset", "zero-7"], None, "error: --cpuset (or TILEGYM_CPUSET): CPU set 'zero-7'"),
        ([], "GPU-b=0-3", f"error: --cpuset (or TILEGYM_CPUSET) gives no CPU set for {GPU}"),
        (["--cpuset", "GPU-a=0-3;GPU-a=4-7"], None, "names GPU-a twice"),
        (["--harness", "nowhere"], None, "error: --harness nowhere is not a checkout with"),
        (["--pids-limit", "0"], None, "error: --pids-limit, --max-output-mib and --max-log-mib"),
    ],
)
def test_runner_bench_refuses_bad_limits_in_one_line(
    tmp_path, fake_repo, monkeypatch, capsys, extra, env, message
):
    if env:
        monkeypatch.setenv("TILEGYM_CPUSET", env)
    else:
        monkeypatch.delenv("TILEGYM_CPUSET", raising=False)
    monkeypatch.chdir(tmp_path)
    sock = tmp_path / "docker.sock"
    with FakeEngine(sock, {IMAGE}, "ok", ok_metrics(*fake_repo)) as engine:
        monkeypatch.setenv("DOCKER_HOST", engine.base_url)
        assert _cli(tmp_path, fake_repo, engine, *extra) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not engine.created


def test_an_oom_the_engine_reports_only_as_an_event_is_named(tmp_path, fake_repo):
    engine, result, doc, _ = run(tmp_path, fake_repo, "oom-late")
    assert (result.status, result.returncode) == ("crash", 137)
    assert "ran out of memory (limit 64g)" in doc["error"]
    assert "events" in engine.call_names() and not engine.containers


def test_a_crash_is_not_read_as_an_oom(tmp_path, fake_repo):
    engine, result, doc, _ = run(tmp_path, fake_repo, "crash")
    assert "ran out of memory" not in doc["error"]
    assert "events" not in engine.call_names()
