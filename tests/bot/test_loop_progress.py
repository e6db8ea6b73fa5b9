"""``tilegym-bot experiment run`` talks while it benchmarks: each side's progress lines reach
the terminal as the benchmark prints them (and the log files still get everything), and a held
GPU lock is waited for by name and given up with one ``error:`` line. Real git repositories,
the bot as a real subprocess, a small bench committed in the repository."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import git
import pytest
from test_bot_local_loop import _commit

BENCH_DIR = "modeling/transformers/src/tilegym_hf_bench"
# What the bench reports: a file a qwen3 experiment may change (its inventory folder).
TEMPLATE = "src/tilegym/transformers/qwen3/kernel_definitions/bench_template.json"

# Prints what the real bench prints, and after its first timed run waits for $GO_FILE, so the
# test can tell that the line was on the terminal while the benchmark was still running.
TALKING_BENCH = textwrap.dedent(
    """
    import argparse, json, os, pathlib, time

    parser = argparse.ArgumentParser()
    for flag in ("--model-key", "--commit", "--metrics-out", "--device"):
        parser.add_argument(flag)
    parser.add_argument("--timed-runs", type=int, default=2)
    args = parser.parse_args()
    print(f"device: {args.device}", flush=True)
    print("warm-up run 1/1: 9.00 tok/s", flush=True)
    print(f"timed run 1/{args.timed_runs}: 10.00 tok/s", flush=True)
    go, deadline = pathlib.Path(os.environ["GO_FILE"]), time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"timed run 2/{args.timed_runs}: 11.00 tok/s" if go.exists() else "unseen", flush=True)
    template = "src/tilegym/transformers/qwen3/kernel_definitions/bench_template.json"
    doc = json.loads(pathlib.Path(template).read_text())
    doc["commit"] = args.commit
    pathlib.Path(args.metrics_out).write_text(json.dumps(doc))
    """
)

HOLD = textwrap.dedent(
    """
    import sys, time
    from tilegym_bot.runner.gpulock import gpu_lock

    with gpu_lock("unpinned", holder={"commit": "cd" * 20}):
        print("held", flush=True)
        time.sleep(120)
    """
)


@pytest.fixture
def experiment(repo, make_metrics):
    """main with the talking bench, and an experiment branch whose head raises coverage."""
    main_sha = _commit(
        repo,
        {
            f"{BENCH_DIR}/__init__.py": "",
            f"{BENCH_DIR}/_cli.py": TALKING_BENCH,
            TEMPLATE: json.dumps(make_metrics(coverage=50.0)),
        },
        "bench",
    )
    repo.git.checkout("-b", "experiment/qwen3/talk")
    head_sha = _commit(repo, {TEMPLATE: json.dumps(make_metrics(coverage=60.0))}, "kernel")
    return repo, main_sha, head_sha


def _bot(r: git.Repo, env: dict[str, str], *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tilegym_bot", "-C", r.working_tree_dir, *args]
    return subprocess.Popen(
        cmd,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _lines(stream) -> queue.Queue:
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def test_experiment_run_shows_each_sides_progress_as_it_goes(experiment, tmp_path):
    r, main_sha, head_sha = experiment
    go = tmp_path / "go"
    env = {"GO_FILE": str(go), "TILEGYM_GPU_LOCK_DIR": str(tmp_path / "locks")}
    bot = _bot(
        r, env, "experiment", "run", "--description", "talk", "--timeout", "120", "--",
        "--device", "cpu",
    )  # fmt: skip
    try:
        err = _lines(bot.stderr)
        seen: list[str] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = err.get(timeout=max(deadline - time.monotonic(), 0.1))
            if line is None:
                break
            seen.append(line)
            if re.fullmatch(rf"\[head {head_sha[:8]} \+\d+s\] timed run 1/2: 10\.00 tok/s", line):
                go.touch()  # the bench is still waiting: this line came while it ran
        out = bot.stdout.read()
        assert bot.wait(timeout=60) == 0, "\n".join(seen)
    finally:
        bot.kill()
    assert go.exists(), "\n".join(seen)
    for side, sha in (("head", head_sha), ("base", main_sha)):
        mine = [line for line in seen if line.startswith(f"[{side} {sha[:8]} +")]
        shown = [line.split("] ", 1)[1] for line in mine]
        assert shown[0].startswith("benchmark --model-key qwen3 ")
        assert "warm-up run 1/1: 9.00 tok/s" in shown
        assert "timed run 2/2: 11.00 tok/s" in shown
        assert shown[-1].startswith("finished in ") and ": ok (exited with status 0)" in shown[-1]
    assert json.loads(out)["status"]  # stdout stays the decision JSON only
    head_log = next((Path(r.working_tree_dir) / "sandbox" / "runs").glob("*-head/*.stdout.log"))
    assert head_log.read_text().splitlines() == [
        "device: cpu",
        "warm-up run 1/1: 9.00 tok/s",
        "timed run 1/2: 10.00 tok/s",
        "timed run 2/2: 11.00 tok/s",
    ]


def test_experiment_run_gives_up_on_a_held_gpu_lock_in_one_line(experiment, tmp_path):
    r, _, _ = experiment
    locks = tmp_path / "locks"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD],
        env={**os.environ, "TILEGYM_GPU_LOCK_DIR": str(locks)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        env = {
            "GO_FILE": str(tmp_path / "go"),
            "TILEGYM_GPU_LOCK_DIR": str(locks),
            "TILEGYM_GPU_LOCK_TIMEOUT": "1",
        }
        bot = _bot(r, env, "experiment", "run", "--description", "x", "--", "--device", "cuda")
        out, err = bot.communicate(timeout=120)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert bot.returncode == 1 and out == ""
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    (wait,) = [line for line in lines if line.startswith("waiting for the GPU lock")]
    assert f"{locks / 'unpinned.lock'} held by pid {holder.pid} (" in wait
    assert "commit cdcdcdcd) since " in wait
    assert lines[-1].startswith("error: gave up after 1 s waiting for the GPU lock ")
    assert not (Path(r.git_dir) / "tilegym-bot" / "prs").exists()  # nothing was recorded
    assert not (Path(r.working_tree_dir) / "sandbox" / "qwen3_results.md").exists()
