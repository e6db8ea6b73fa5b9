"""LocalExecutor end to end: a real subprocess of a stand-in bench in a real git checkout."""

from __future__ import annotations

import io
import json
import re
import shutil
import textwrap
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


@pytest.mark.slow
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


# A bench that talks: progress lines as the real one prints them, a flood of output, or endless
# chatter while it ignores SIGTERM. ``--go-file``: it waits for that file after its first timed
# run, so a test can prove each line reached the terminal while the bench was still running.
TALKING_BENCH = textwrap.dedent(
    """
    import json, signal, sys, time
    from pathlib import Path

    args = sys.argv[1:]

    def val(flag):
        return args[args.index(flag) + 1] if flag in args else None

    mode, out = val("--model-key"), Path(val("--metrics-out"))
    template = json.loads((Path(__file__).parent / "ok_metrics.json").read_text())
    template["commit"] = val("--commit")
    if mode == "progress":
        print("warm-up run 1/1: 9.00 tok/s", flush=True)
        print("timed run 1/2: 10.00 tok/s", flush=True)
        go, deadline = Path(val("--go-file")), time.monotonic() + 30
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        print("timed run 2/2: 11.00 tok/s" if go.exists() else "nobody saw run 1", flush=True)
        print("profiling 10%\\rprofiling 100%", flush=True)
        print("warnings go to stderr", file=sys.stderr, flush=True)
        out.write_text(json.dumps(template))
    elif mode == "flood":
        sys.stdout.write(("x" * 99 + "\\n") * int(val("--lines")))
        sys.stdout.write("no newline at the end")
        sys.stdout.flush()
        out.write_text(json.dumps(template))
    elif mode == "chatter":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for i in range(10**6):
            print(f"still going {i}", flush=True)
            time.sleep(0.05)
    """
)


@pytest.fixture(scope="module")
def talking_repo(tmp_path_factory):
    import git

    root, _ = make_fake_repo(tmp_path_factory.mktemp("talking"))
    cli = "modeling/transformers/src/tilegym_hf_bench/_cli.py"
    (root / cli).write_text(TALKING_BENCH)
    repo = git.Repo(root)
    repo.index.add([cli])
    return root, repo.index.commit("a bench that talks").hexsha


class Terminal(io.StringIO):
    """Stands for the user's terminal; creates ``go`` once it has shown ``trigger``."""

    def __init__(self, go: Path | None = None, trigger: str = "timed run 1/2"):
        super().__init__()
        self.go, self.trigger = go, trigger

    def write(self, text: str) -> int:
        if self.go is not None and self.trigger in text:
            self.go.touch()
        return super().write(text)


def test_progress_reaches_the_terminal_while_the_bench_runs(talking_repo, tmp_path):
    repo, sha = talking_repo
    go = tmp_path / "go"
    term = Terminal(go)
    req = request(repo, sha, tmp_path, "progress", "--go-file", str(go))
    result = LocalExecutor(echo=True, label="head", stream=term).run(req)
    assert result.status == "ok"
    lines = term.getvalue().splitlines()
    prefix = re.compile(rf"\[head {sha[:8]} \+\d+s\] ")
    assert all(prefix.match(line) for line in lines), lines
    shown = [prefix.sub("", line) for line in lines]
    assert shown[0].startswith("benchmark --model-key progress --go-file ")
    assert shown[1:6] == [
        "warm-up run 1/1: 9.00 tok/s",
        "timed run 1/2: 10.00 tok/s",
        "timed run 2/2: 11.00 tok/s",  # shown only if run 1/2 was shown while the bench waited
        "profiling 100%",
        shown[5],
    ]
    assert re.fullmatch(r"finished in \d+ s: ok \(exited with status 0\); metrics \S+", shown[5])
    assert "warnings go to stderr" not in term.getvalue()
    # The log keeps the bench's own bytes, without prefixes; stderr has its own log.
    assert result.stdout_log.read_bytes() == (
        b"warm-up run 1/1: 9.00 tok/s\ntimed run 1/2: 10.00 tok/s\ntimed run 2/2: 11.00 tok/s\n"
        b"profiling 10%\rprofiling 100%\n"
    )
    assert result.stderr_log.read_text() == "warnings go to stderr\n"


def test_quiet_executor_only_writes_the_logs(talking_repo, tmp_path):
    repo, sha = talking_repo
    go = tmp_path / "go"
    go.touch()
    term = Terminal()
    result = LocalExecutor(echo=False, stream=term).run(
        request(repo, sha, tmp_path, "progress", "--go-file", str(go))
    )
    assert result.status == "ok" and term.getvalue() == ""
    assert "timed run 2/2: 11.00 tok/s" in result.stdout_log.read_text()


def test_a_flood_of_output_neither_blocks_nor_loses_a_byte(talking_repo, tmp_path):
    repo, sha = talking_repo
    term = Terminal()
    lines = 200_000  # 20 MB: far beyond a pipe's buffer
    result = LocalExecutor(stream=term).run(
        request(repo, sha, tmp_path, "flood", "--lines", str(lines))
    )
    assert result.status == "ok"
    assert result.stdout_log.stat().st_size == 100 * lines + len("no newline at the end")
    shown = term.getvalue().splitlines()
    assert len(shown) == lines + 3  # start line, the lines, the unterminated tail, the end line
    assert shown[-2].endswith("] no newline at the end")


def test_timeout_still_kills_a_bench_that_keeps_talking(talking_repo, tmp_path):
    repo, sha = talking_repo
    term = Terminal()
    t0 = time.monotonic()
    result = LocalExecutor(grace_s=0.5, stream=term).run(
        request(repo, sha, tmp_path, "chatter", timeout=1.5)
    )
    assert result.status == "timeout" and result.returncode == -9
    assert time.monotonic() - t0 < 15
    shown = term.getvalue().splitlines()
    assert any(line.endswith("] still going 0") for line in shown)
    assert "finished in " in shown[-1]
    assert ": timeout: killed after the 1.5 s limit; metrics " in shown[-1]
    assert "still going 0\n" in result.stdout_log.read_text()
