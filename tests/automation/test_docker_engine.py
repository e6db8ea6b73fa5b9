"""DockerExecutor against a real Docker engine and the CPU experiment image (marker ``docker``).

``bash scripts/docker_check.sh`` starts an engine, builds the image and runs this file. Each limit
test runs a stand-in bench (a checkout whose ``tilegym_hf_bench._cli`` misbehaves on purpose) in
the real image through the real executor, and asserts what the engine enforced: a test fails
when the executor stops passing its limit. Without an engine or the image the tests skip with
the reason (they fail instead under ``TILEGYM_DOCKER_REQUIRED=1``, as the check script sets).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import docker
import git
import pytest
from docker.errors import DockerException, ImageNotFound
from tilegym_bot.doctor import main as bot_main
from tilegym_bot.runner.base import BenchRequest, synthesize_metrics
from tilegym_bot.runner.docker import BENCH_LABEL, GPU_LABEL, DockerExecutor
from tilegym_hf_bench.metrics_schema import validation_errors

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("TILEGYM_IMAGE", "tilegym-experiment:cpu")
REQUIRED = os.environ.get("TILEGYM_DOCKER_REQUIRED") == "1"
GPU = "GPU-5d8e2f3c-0a1b-4c2d-9e8f-001122334455"
BOT = [sys.executable, "-m", "tilegym_bot.cli"]

STANDIN = textwrap.dedent(
    """
    import errno, json, os, socket, sys, time
    from pathlib import Path

    args = sys.argv[1:]

    def val(flag):
        return args[args.index(flag) + 1] if flag in args else None

    key, out = val("--model-key"), Path(val("--metrics-out"))
    print("stand-in", key, "pid", os.getpid(), flush=True)

    def write_metrics():
        doc = json.loads((Path(__file__).parent / "ok_metrics.json").read_text())
        doc["commit"] = val("--commit")
        out.write_text(json.dumps(doc))

    def attempt(fn):
        try:
            fn()
            return "ok"
        except OSError as exc:
            return errno.errorcode.get(exc.errno, str(exc.errno))

    if key == "probe":
        facts = {
            "interfaces": sorted(os.listdir("/sys/class/net")),
            "connect": attempt(lambda: socket.create_connection(
                ("127.0.0.1", int(val("--port"))), timeout=5).close()),
            "write_repo": attempt(lambda: Path("/workspace/repo/intruder").write_text("x")),
            "write_harness": attempt(lambda: Path("/workspace/harness/intruder").write_text("x")),
            "cpus": sorted(os.sched_getaffinity(0)),
        }
        print("FACTS " + json.dumps(facts), flush=True)
        write_metrics()
    elif key == "ok":
        write_metrics()
    elif key == "forkbomb":
        # Bounded by itself (at most 2000 processes), so a missing pids limit fails the test
        # without harming the shared host.
        children = 0
        try:
            while children < 2000:
                if os.fork() == 0:
                    time.sleep(120)
                    os._exit(0)
                children += 1
        except OSError as exc:
            print(f"FORK stopped after {children}: {errno.errorcode[exc.errno]}", flush=True)
            sys.exit(1)
        print(f"FORK unbounded: {children}", flush=True)
        sys.exit(1)
    elif key == "hog":
        chunks = []
        for i in range(16):  # 1 GiB in 64 MiB pieces, every page touched
            chunks.append(bytearray(64 * 1024 * 1024))
            print(f"HOG {(i + 1) * 64} MiB", flush=True)
        print("HOG allocated all", flush=True)
        write_metrics()
    elif key == "flood":
        with open(out.parent / "flood.bin", "wb") as fh:
            for i in range(256):  # at most 256 MiB
                fh.write(b"x" * (1024 * 1024))
                fh.flush()
                time.sleep(0.02)
        print("FLOOD done", flush=True)
        write_metrics()
    elif key == "sleep":
        print("SLEEP started", flush=True)
        time.sleep(600)
        print("SLEEP done", flush=True)
    """
)


def make_standin(root: Path) -> tuple[Path, str]:
    """A git checkout at ``root`` whose bench is the stand-in; (path, HEAD sha)."""
    pkg = root / "modeling/transformers/src/tilegym_hf_bench"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Stand-in bench for the real-engine tests."""\n')
    (pkg / "_cli.py").write_text(STANDIN)
    probe = BenchRequest(root, "0" * 40, ["--model-key", "ok"], root / "m.json", root)
    template = synthesize_metrics(probe, "ok", "", "2026-01-01T00:00:00+00:00", 1.0)
    (pkg / "ok_metrics.json").write_text(json.dumps(dict(template, error=None)))
    for rel in ("src", "bot", "hooks"):
        (root / rel).mkdir(exist_ok=True)
        (root / rel / ".keep").write_text("")
    repo = git.Repo.init(root)
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "t").set_value("user", "email", "t@example.com")
    repo.git.add("-A")
    repo.index.commit("stand-in bench")
    return root, repo.head.commit.hexsha


@pytest.fixture(scope="module")
def client():
    def unavailable(why: str):
        message = f"{why}; `bash scripts/docker_check.sh` starts an engine and builds {IMAGE}"
        pytest.fail(message) if REQUIRED else pytest.skip(message)

    try:
        engine = docker.from_env(timeout=300)
        engine.ping()
    except DockerException as exc:
        unavailable(f"no Docker engine answers ({str(exc).splitlines()[0]})")
    try:
        engine.images.get(IMAGE)
    except ImageNotFound:
        unavailable(f"image {IMAGE} not built")
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    return make_standin(tmp_path_factory.mktemp("standin"))


def bench(client, tmp_path, checkout, behaviour, *, gpu=None, device="cpu", timeout=120.0,
          harness=None, extra=(), **limits):  # fmt: skip
    repo, sha = checkout
    request = BenchRequest(
        repo_dir=repo,
        commit=sha,
        bench_args=["--model-key", behaviour, "--device", device, *extra],
        metrics_out=tmp_path / "out" / "metrics.json",
        log_dir=tmp_path / "logs",
        timeout_s=timeout,
        gpu_uuid=gpu,
        harness_dir=harness,
    )
    limits.setdefault("memory_limit", "1g")
    executor = DockerExecutor(IMAGE, client=client, grace_s=1.0, **limits)
    t0 = time.monotonic()
    result = executor.run(request)
    elapsed = time.monotonic() - t0
    doc = json.loads(result.metrics_path.read_text())
    assert validation_errors(doc) == []
    return result, doc, elapsed


def leftovers(client, sha: str) -> list:
    return client.containers.list(all=True, filters={"label": f"tilegym.commit={sha}"})


def stdout_of(result) -> str:
    return result.stdout_log.read_text()


@pytest.fixture(scope="module")
def probe(client, standin, tmp_path_factory):
    """One run of the stand-in's probe with a harness, a CPU set and a listener on the host."""
    tmp = tmp_path_factory.mktemp("probe")
    harness, _ = make_standin(tmp / "harness")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        result, doc, _ = bench(
            client, tmp, standin, "probe", harness=harness, cpusets={"": "0"},
            extra=("--port", str(port)),
        )  # fmt: skip
    finally:
        listener.close()
    [line] = [x for x in stdout_of(result).splitlines() if x.startswith("FACTS ")]
    return result, doc, json.loads(line[len("FACTS ") :]), standin[0], harness


def test_the_probe_run_is_ok_and_leaves_no_container(client, probe, standin):
    result, doc, _, _, _ = probe
    assert (result.status, doc["status"], doc["commit"]) == ("ok", "ok", standin[1])
    assert leftovers(client, standin[1]) == []


def test_no_network_a_connect_to_the_host_fails(probe):
    facts = probe[2]
    assert facts["interfaces"] == ["lo"]
    assert facts["connect"] == "ECONNREFUSED"  # the host listens on that port; lo is its own


def test_checkout_and_harness_are_mounted_read_only(probe):
    facts, repo, harness = probe[2], probe[3], probe[4]
    assert (facts["write_repo"], facts["write_harness"]) == ("EROFS", "EROFS")
    assert not (repo / "intruder").exists() and not (harness / "intruder").exists()


def test_the_cpu_set_is_applied(probe):
    assert probe[2]["cpus"] == [0]


def test_a_fork_bomb_is_stopped_by_the_pids_limit(client, standin, tmp_path):
    result, doc, _ = bench(client, tmp_path, standin, "forkbomb", pids_limit=40)
    [line] = [x for x in stdout_of(result).splitlines() if x.startswith("FORK ")]
    assert line.startswith("FORK stopped after") and line.endswith("EAGAIN"), line
    assert int(line.split()[3].rstrip(":")) < 40
    assert (result.status, doc["status"]) == ("crash", "crash")
    assert leftovers(client, standin[1]) == []
    assert subprocess.run(["true"]).returncode == 0  # the host still forks


def test_the_memory_limit_kills_a_hog(client, standin, tmp_path):
    result, doc, _ = bench(client, tmp_path, standin, "hog", memory_limit="256m")
    assert "HOG allocated all" not in stdout_of(result)
    assert result.status == "crash"
    assert "ran out of memory (limit 256m)" in doc["error"]


def lifetime_s(client, sha: str, since: int) -> float:
    """Seconds from the container's start to its death, from the engine's events: making and
    removing a container's root filesystem (a full copy with vfs storage, a minute and more on a
    busy host) is not part of how fast a limit acts."""
    events = client.events(
        since=since, until=int(time.time()) + 1, decode=True,
        filters={"label": f"tilegym.commit={sha}", "type": "container"},
    )  # fmt: skip
    when = {e["Action"]: e["timeNano"] / 1e9 for e in events if e["Action"] in ("start", "die")}
    return when["die"] - when["start"]


def test_a_flood_of_the_output_folder_is_killed(client, standin, tmp_path):
    since = int(time.time()) - 1
    result, doc, _ = bench(client, tmp_path, standin, "flood", out_bytes=4 * 1024 * 1024)
    assert "FLOOD done" not in stdout_of(result)
    assert result.status == "crash"
    assert "more than 4194304 bytes into its output folder" in doc["error"]
    assert lifetime_s(client, standin[1], since) < 30  # the flood ran for 120 s unchecked
    assert not list((tmp_path / "logs").glob("docker-out-*"))


def test_a_run_past_its_limit_is_stopped_killed_removed_and_a_timeout(client, standin, tmp_path):
    since = int(time.time()) - 1
    result, doc, _ = bench(client, tmp_path, standin, "sleep", timeout=3.0)
    assert (result.status, doc["status"]) == ("timeout", "timeout")
    assert "SLEEP started" in stdout_of(result) and "SLEEP done" not in stdout_of(result)
    assert lifetime_s(client, standin[1], since) < 3.0 + 1.0 + 10  # limit, grace, slack
    assert leftovers(client, standin[1]) == []
    events = client.events(
        since=since, until=int(time.time()) + 1, decode=True,
        filters={"label": f"tilegym.commit={standin[1]}", "type": "container"},
    )  # fmt: skip
    seen = [(e["Action"], e["Actor"]["Attributes"].get("signal")) for e in events]
    actions = [action for action, _ in seen]
    assert ("kill", "15") in seen and ("kill", "9") in seen, seen  # stopped, then killed
    assert actions[-1] == "destroy", seen


def test_a_killed_runner_leaves_a_labelled_container_the_next_run_sweeps(client, standin, tmp_path):
    repo, sha = standin
    cmd = [
        *BOT, "runner", "bench", "--executor", "docker", "--image", IMAGE, "--repo", str(repo),
        "--metrics-out", str(tmp_path / "killed.json"), "--lock-dir", str(tmp_path / "locks"),
        "--memory", "512m", "--pids-limit", "64", "--timeout", "300",
        "--", "--model-key", "sleep", "--device", "cuda",
    ]  # fmt: skip
    runner = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not [c for c in leftovers(client, sha) if c.status == "running"]:
            assert runner.poll() is None and time.monotonic() < deadline, "no container ran"
            time.sleep(0.5)
    finally:
        runner.send_signal(signal.SIGKILL)
        runner.wait()
    [stale] = leftovers(client, sha)
    labels = stale.labels
    assert (labels[BENCH_LABEL], labels[GPU_LABEL], labels["tilegym.commit"]) == (
        "1",
        "unpinned",
        sha,
    )
    host = stale.attrs["HostConfig"]  # the request as the engine stored it
    assert (host["NetworkMode"], host["PidsLimit"], host["Memory"]) == ("none", 64, 512 * 1024**2)
    assert f"{repo.resolve()}:/workspace/repo:ro" in host["Binds"]
    result, doc, _ = bench(client, tmp_path, standin, "ok", device="cuda")
    assert (result.status, doc["status"]) == ("ok", "ok")
    assert f"removed stale container {stale.id[:12]} of unpinned" in result.stderr_log.read_text()
    assert leftovers(client, sha) == []


class RecordingProxy:
    """A Unix socket that forwards every byte to the engine's socket and records the requests."""

    def __init__(self, path: Path, engine_socket: str):
        self.path, self.engine_socket, self.sent = path, engine_socket, bytearray()
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.server.accept()
            except OSError:
                return
            far = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            far.connect(self.engine_socket)
            threading.Thread(target=self._pipe, args=(near, far, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(far, near, False), daemon=True).start()

    def _pipe(self, src, dst, record: bool) -> None:
        try:
            while data := src.recv(65536):
                if record:
                    self.sent.extend(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def create_bodies(self) -> list[dict]:
        bodies = []
        for request in bytes(self.sent).split(b"POST ")[1:]:
            line, _, rest = request.partition(b"\r\n")
            if b"/containers/create" in line:
                head, _, body = rest.partition(b"\r\n\r\n")
                length = int(next(h.split(b":")[1] for h in head.split(b"\r\n")
                                  if h.lower().startswith(b"content-length")))  # fmt: skip
                bodies.append(json.loads(body[:length]))
        return bodies

    def close(self) -> None:
        self.server.close()


def test_the_gpu_is_requested_by_uuid_and_the_engine_answers(client, standin, tmp_path):
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        pytest.skip(f"DOCKER_HOST={host} is not a Unix socket to record the requests on")
    proxy = RecordingProxy(tmp_path / "proxy.sock", host[len("unix://") :])
    try:
        recorded = docker.DockerClient(base_url=f"unix://{proxy.path}", version="auto", timeout=300)
        result, doc, _ = bench(recorded, tmp_path, standin, "ok", gpu=GPU, device="cuda")
        recorded.close()
    finally:
        proxy.close()
    [body] = proxy.create_bodies()
    assert body["HostConfig"]["DeviceRequests"] == [
        {"Driver": "", "Count": 0, "DeviceIDs": [GPU], "Capabilities": [["gpu"]], "Options": {}}
    ]
    assert body["Labels"][GPU_LABEL] == GPU
    # This engine has no NVIDIA runtime: it refuses the device, and nothing is left behind.
    assert result.status == "crash" and "docker error" in doc["error"]
    assert leftovers(client, standin[1]) == []


def test_the_real_bench_of_tiny_qwen3_in_the_image_writes_valid_metrics(client, tmp_path):
    clone = tmp_path / "clone"
    git.Repo.clone_from(ROOT, clone)
    sha = git.Repo(clone).head.commit.hexsha
    metrics = tmp_path / "metrics.json"
    cmd = [
        *BOT, "runner", "bench", "--executor", "docker", "--image", IMAGE, "--repo", str(clone),
        "--metrics-out", str(metrics), "--memory", "8g", "--timeout", "600",
        "--", "--model-key", "tiny-qwen3", "--device", "cpu",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("*.log"))
    assert proc.returncode == 0, proc.stdout + proc.stderr + logs[-3000:]
    doc = json.loads(metrics.read_text())
    assert validation_errors(doc) == []
    assert (doc["status"], doc["commit"], doc["model_key"]) == ("ok", sha, "tiny-qwen3")
    assert doc["baseline"] is not None
    assert leftovers(client, sha) == []


def test_the_doctor_checks_the_real_engine_and_image(client, capsys, monkeypatch):
    skips = [
        a for s in ("gpu", "cuda-tile", "toolchain", "profilers", "git") for a in ("--skip", s)
    ]
    assert bot_main(["doctor", "--image", IMAGE, *skips]) == 0
    assert capsys.readouterr().out.startswith(f"ok    image: image {IMAGE} present")
    assert bot_main(["doctor", "--image", "tilegym-experiment:absent", *skips]) == 1
    assert "FAIL  image: image tilegym-experiment:absent not found" in capsys.readouterr().out
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert bot_main(["doctor", "--image", IMAGE, *skips]) == 1
    assert "FAIL  image: docker is not reachable" in capsys.readouterr().out
