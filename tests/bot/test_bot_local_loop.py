"""The whole local experiment loop on a real temporary git repository, through the CLI."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import git
import pytest
from tilegym_bot import ledger
from tilegym_bot.cli import main
from tilegym_bot.ledger import LedgerRow

MODEL_DIR = "src/tilegym/transformers/qwen3"


def _commit(r: git.Repo, files: dict[str, str], message: str) -> str:
    root = Path(r.working_tree_dir)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    r.index.add(list(files))
    return r.index.commit(message).hexsha


def _cli(r: git.Repo, *args: str) -> int:
    return main(["-C", r.working_tree_dir, *args])


def _kernel_files(name: str) -> dict[str, str]:
    return {
        f"{MODEL_DIR}/kernel_definitions/{name}.json": json.dumps({"name": name}),
        f"{MODEL_DIR}/kernel_solutions/{name}.json": json.dumps({"name": f"{name}_cutile"}),
        f"{MODEL_DIR}/kernels/{name}.py": "def kernel():\n    pass\n",
    }


def _snapshot(r: git.Repo) -> tuple:
    """Everything an action could change: refs, HEAD, tree status, sandbox and bot state files."""
    root = Path(r.working_tree_dir)
    files = {}
    for base in (root / "sandbox", Path(r.git_dir) / "tilegym-bot"):
        for path in sorted(base.rglob("*")) if base.exists() else []:
            if path.is_file() and not path.name.endswith(".lock"):
                files[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return (
        r.git.show_ref(),
        r.git.rev_parse("HEAD"),
        r.git.symbolic_ref("-q", "HEAD", with_exceptions=False),
        r.git.status("--porcelain", "--ignored"),
        files,
    )


def _metrics_files(tmp_path, save_metrics, make_metrics, r, base_kw, head_kw, tag=""):
    main_sha, head_sha = r.git.rev_parse("main"), r.git.rev_parse("HEAD")
    base = save_metrics(tmp_path / f"base{tag}.json", make_metrics(commit=main_sha, **base_kw))
    head = save_metrics(tmp_path / f"head{tag}.json", make_metrics(commit=head_sha, **head_kw))
    return ["--base-metrics", str(base), "--head-metrics", str(head)]


def _ledger(r):
    return ledger.read(ledger.ledger_path(Path(r.working_tree_dir), "qwen3"))


def _records(r):
    prs = Path(r.git_dir) / "tilegym-bot" / "prs"
    return [json.loads(p.read_text()) for p in sorted(prs.glob("*.json"))]


def test_keep_then_discard_loop(repo, tmp_path, make_metrics, save_metrics, capsys):
    r = repo
    main0 = r.git.rev_parse("main")
    assert _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "fused-rmsnorm") == 0
    assert r.active_branch.name == "experiment/qwen3/fused-rmsnorm"
    head1 = _commit(r, _kernel_files("qwen3_rms_norm"), "qwen3: fused rmsnorm")
    files = _metrics_files(tmp_path, save_metrics, make_metrics, r, {}, {"coverage": 61.2})
    capsys.readouterr()
    assert _cli(r, "experiment", "run", "--description", "fused RMSNorm", *files) == 0
    out = capsys.readouterr()
    decision = json.loads(out.out)
    assert decision["status"] == "keep" and decision["ledger_status"] == "keep"
    assert decision["coverage"] == {"base": 50.0, "head": 61.2, "delta_pp": pytest.approx(11.2)}

    # keep: main is a merge commit of the old main and the experiment head; tree untouched
    merged = r.commit("main")
    assert [p.hexsha for p in merged.parents] == [main0, head1]
    assert r.active_branch.name == "experiment/qwen3/fused-rmsnorm" and not r.is_dirty()
    assert _ledger(r) == [
        LedgerRow(main0, 50.0, 50.0, "keep", "baseline"),
        LedgerRow(head1, 61.2, 50.0, "keep", "fused RMSNorm"),
    ]
    (record,) = _records(r)
    assert record["number"] == 1 and record["state"] == "merged"
    assert (record["base_sha"], record["head_sha"]) == (main0, head1)
    assert record["branch"] == "experiment/qwen3/fused-rmsnorm"
    assert record["metrics"]["head"]["coverage"]["gpu_time_pct"] == 61.2
    assert record["decision"] == decision
    assert record["created_at"] and record["decided_at"] and record["updated_at"]
    assert record["comment"].startswith("<!-- tilegym-bot:autokernel -->")
    prs = Path(r.git_dir) / "tilegym-bot" / "prs"
    assert (prs / "1.md").read_text() == record["comment"] and (prs / "1.png").stat().st_size > 0

    # idempotent: same branch + SHA again changes nothing
    before = _snapshot(r)
    assert _cli(r, "experiment", "run", "--description", "fused RMSNorm", *files) == 0
    assert json.loads(capsys.readouterr().out) == decision
    assert _snapshot(r)[:4] == before[:4] and len(_ledger(r)) == 2

    assert _cli(r, "experiment", "advance") == 0
    assert r.active_branch.name == "main"
    assert "experiment/qwen3/fused-rmsnorm" not in [h.name for h in r.heads]

    # discard path: no coverage gain
    main1 = r.git.rev_parse("main")
    assert _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "rope") == 0
    head2 = _commit(r, _kernel_files("qwen3_rope"), "qwen3: rope")
    files = _metrics_files(
        tmp_path, save_metrics, make_metrics, r, {"coverage": 61.2}, {"coverage": 61.2}, tag="2"
    )
    capsys.readouterr()
    assert _cli(r, "experiment", "run", "--description", "rope kernel", *files) == 0
    decision = json.loads(capsys.readouterr().out)
    assert decision["status"] == "discard"
    assert "coverage 61.20% → 61.20%: no gain" in decision["reasons"][0]
    assert r.git.rev_parse("main") == main1
    assert r.git.rev_parse("experiment-archive/qwen3/rope^{commit}") == head2
    drafts = Path(r.working_tree_dir) / "sandbox/qwen3/drafts/rope"
    assert sorted(p.relative_to(drafts).as_posix() for p in drafts.rglob("*.json")) == [
        "kernel_definitions/qwen3_rope.json",
        "kernel_solutions/qwen3_rope.json",
    ]
    assert _ledger(r)[-1] == LedgerRow(head2, 61.2, 50.0, "discard", "rope kernel")
    assert _records(r)[-1]["state"] == "closed"

    # ledger rebuild from the PR comments gives the same table
    path = ledger.ledger_path(Path(r.working_tree_dir), "qwen3")
    text = path.read_text()
    path.unlink()
    assert _cli(r, "ledger", "rebuild", "--model-key", "qwen3") == 0
    assert path.read_text() == text
    capsys.readouterr()
    assert _cli(r, "ledger", "show", "--model-key", "qwen3") == 0
    assert capsys.readouterr().out == text

    assert _cli(r, "experiment", "advance") == 0
    assert r.active_branch.name == "main"
    assert _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "rope") == 1


def test_baseline_only_branch_records_main(repo, tmp_path, make_metrics, save_metrics, capsys):
    r = repo
    main0 = r.git.rev_parse("main")
    assert _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "baseline") == 0
    head = save_metrics(
        tmp_path / "h.json", make_metrics(commit=main0, coverage=49.21, cutile=(53.41,))
    )
    capsys.readouterr()
    assert (
        _cli(r, "experiment", "run", "--description", "measure main", "--head-metrics", str(head))
        == 0
    )
    assert json.loads(capsys.readouterr().out)["status"] == "keep"
    assert (
        ledger.ledger_path(Path(r.working_tree_dir), "qwen3")
        .read_text()
        .endswith(f"| {main0[:8]} | 49.21 | 53.41 | keep | baseline |\n")
    )
    assert r.git.rev_parse("main") == main0


def test_inconclusive_waits_for_rerun_then_discards(
    repo, tmp_path, make_metrics, save_metrics, capsys
):
    r = repo
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "noisy")
    head = _commit(r, _kernel_files("qwen3_noisy"), "noisy")
    noisy = {"cutile": (40.0, 60.0, 50.0)}
    slower = {"coverage": 55.0, "cutile": (38.0, 58.0, 48.0)}
    files = _metrics_files(tmp_path, save_metrics, make_metrics, r, noisy, slower)
    capsys.readouterr()
    assert _cli(r, "experiment", "run", "--description", "noisy", *files) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "inconclusive"
    assert _ledger(r) == [] and _records(r)[0]["state"] == "open"
    assert r.tags == []
    files = _metrics_files(tmp_path, save_metrics, make_metrics, r, noisy, slower, tag="rerun")
    assert _cli(r, "experiment", "run", "--description", "noisy", *files) == 0
    decision = json.loads(capsys.readouterr().out)
    assert decision["status"] == "discard"
    assert "after the rerun" in decision["reasons"][-1]
    assert _ledger(r)[-1] == LedgerRow(head, 55.0, 48.0, "discard", "noisy")


def test_main_moved_with_clean_merge_is_merged(repo, tmp_path, make_metrics, save_metrics):
    r = repo
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "mlp")
    head = _commit(r, _kernel_files("qwen3_mlp"), "mlp")
    r.git.checkout("main")
    other = _commit(r, {"README.md": "readme v2\n"}, "docs")
    r.git.checkout("experiment/qwen3/mlp")
    files = _metrics_files(tmp_path, save_metrics, make_metrics, r, {}, {"coverage": 70.0})
    assert _cli(r, "experiment", "run", "--description", "mlp", *files) == 0
    merged = r.commit("main")
    assert [p.hexsha for p in merged.parents] == [other, head]
    assert (merged.tree / "README.md").data_stream.read() == b"readme v2\n"
    assert (merged.tree / f"{MODEL_DIR}/kernels/qwen3_mlp.py") is not None


def _refusal(r, capsys, *args) -> str:
    before = _snapshot(r)
    capsys.readouterr()
    assert _cli(r, *args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "Traceback" not in "\n".join(err)
    assert _snapshot(r) == before
    return err[-1]


def test_refusals_change_nothing(repo, tmp_path, make_metrics, save_metrics, capsys):
    r = repo
    root = Path(r.working_tree_dir)
    files = ["--base-metrics", str(tmp_path / "x.json"), "--head-metrics", str(tmp_path / "y.json")]
    assert "not an experiment branch" in _refusal(
        r, capsys, "experiment", "run", "--description", "x", *files
    )
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "attn")
    attn_kernel = f"{MODEL_DIR}/kernels/qwen3_attn.py"
    _commit(r, _kernel_files("qwen3_attn"), "attn")
    good = _metrics_files(tmp_path, save_metrics, make_metrics, r, {}, {"coverage": 60.0})

    (root / "README.md").write_text("edited\n")
    assert "dirty" in _refusal(r, capsys, "experiment", "run", "--description", "x", *good)
    assert "dirty" in _refusal(
        r, capsys, "experiment", "start", "--model-key", "qwen3", "--name", "other"
    )
    r.git.checkout("--", "README.md")

    stale = save_metrics(tmp_path / "stale.json", make_metrics(commit="c" * 40, coverage=60.0))
    msg = _refusal(
        r,
        capsys,
        "experiment",
        "run",
        "--description",
        "x",
        "--base-metrics",
        good[1],
        "--head-metrics",
        str(stale),
    )
    assert "metrics are of commit cccccccc" in msg

    r.git.checkout("main")
    _commit(r, {attn_kernel: "def kernel():\n    return 1\n"}, "conflict")
    r.git.checkout("experiment/qwen3/attn")
    good = _metrics_files(tmp_path, save_metrics, make_metrics, r, {}, {"coverage": 60.0}, tag="c")
    msg = _refusal(r, capsys, "experiment", "run", "--description", "x", *good)
    assert "main moved" in msg and attn_kernel in msg

    r.git.checkout("main")
    assert "not an experiment branch" in _refusal(r, capsys, "experiment", "advance")
    r.git.checkout("experiment/qwen3/attn")
    assert "no decision yet" in _refusal(r, capsys, "experiment", "advance")

    bad = ledger.ledger_path(root, "qwen3")
    bad.write_text("| not | a ledger |\n")
    msg = _refusal(r, capsys, "experiment", "run", "--description", "x", *good)
    assert "is malformed" in msg


def test_reset_archives_an_undecided_experiment(repo, capsys):
    r = repo
    main0 = r.git.rev_parse("main")
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "abandon")
    head = _commit(r, _kernel_files("qwen3_abandon"), "wip")
    assert _cli(r, "experiment", "reset") == 0
    assert r.active_branch.name == "main" and r.git.rev_parse("main") == main0
    assert r.git.rev_parse("experiment-archive/qwen3/abandon^{commit}") == head
    assert "experiment/qwen3/abandon" not in [h.name for h in r.heads]
    assert (
        Path(r.working_tree_dir)
        / "sandbox/qwen3/drafts/abandon/kernel_solutions/qwen3_abandon.json"
    ).exists()
    assert _ledger(r) == [] and _records(r)[0]["state"] == "abandoned"


def test_bad_usage_is_one_error_line(repo, capsys):
    with pytest.raises(SystemExit) as info:
        main(["experiment", "start", "--model-key", "qwen3"])
    assert info.value.code == 2
    assert capsys.readouterr().err.startswith("error: the following arguments are required")
    assert _cli(repo, "experiment", "start", "--model-key", "Qwen 3", "--name", "x") == 1
    assert "error: model key" in capsys.readouterr().err


# The metrics the fake bench reports: a file the experiment may change (an inventory folder).
BENCH_TEMPLATE = "src/tilegym/transformers/qwen3/kernel_definitions/bench_template.json"
FAKE_BENCH = """\
import argparse, json, os, pathlib, subprocess, time

TEMPLATE = "src/tilegym/transformers/qwen3/kernel_definitions/bench_template.json"

parser = argparse.ArgumentParser()
for flag in ("--model-key", "--commit", "--metrics-out", "--device"):
    parser.add_argument(flag)
parser.add_argument("--timed-runs", type=int, default=2)
args = parser.parse_args()
doc = json.loads(pathlib.Path(TEMPLATE).read_text())
samples = doc["cutile"]["throughput"]["samples"]
doc["cutile"]["throughput"]["samples"] = (samples * args.timed_runs)[: args.timed_runs]
doc["workload"]["timed_runs"] = args.timed_runs
doc["commit"] = args.commit
pathlib.Path(args.metrics_out).write_text(json.dumps(doc))
if os.environ.get("HANG_AT_RUNS") == str(args.timed_runs):  # an interrupted rerun
    pathlib.Path(os.environ["HANG_PID_FILE"]).write_text(str(os.getpid()))
    time.sleep(120)
if os.environ.get("MOVE_HEAD_IN"):  # someone commits on the branch while it is benchmarked
    subprocess.run(["git", "-C", os.environ.pop("MOVE_HEAD_IN"), "commit", "--allow-empty",
                    "-qm", "moved"], check=True)
"""


def _with_bench(r, base_doc):
    bench = "modeling/transformers/src/tilegym_hf_bench"
    files = {
        f"{bench}/__init__.py": "",
        f"{bench}/_cli.py": FAKE_BENCH,
        BENCH_TEMPLATE: json.dumps(base_doc),
    }
    _commit(r, files, "bench")


def test_runner_benchmarks_worktrees_and_reruns_with_twice_the_samples(repo, make_metrics, capsys):
    """No metrics files: main and HEAD are benchmarked through the runner's LocalExecutor in
    throwaway worktrees (a small bench committed in the repo stands in for tilegym-hf-bench)."""
    r = repo
    _with_bench(r, make_metrics(cutile=(40.0, 60.0, 50.0)))
    main_sha = r.git.rev_parse("main")
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "slow")
    head_doc = make_metrics(coverage=55.0, cutile=(38.0, 58.0, 48.0))
    head_sha = _commit(r, {BENCH_TEMPLATE: json.dumps(head_doc)}, "slower kernel")
    capsys.readouterr()
    code = _cli(
        r,
        "experiment",
        "run",
        "--description",
        "slow",
        "--timeout",
        "60",
        "--sampling-budget",
        "0",
        "--",
        "--device",
        "cpu",
        "--timed-runs",
        "3",
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    decision = json.loads(out.out)
    assert decision["status"] == "discard"
    assert "after the rerun with twice the samples" in decision["reasons"][-1]
    assert decision["sampling"] is None  # the fixed scheme
    (record,) = _records(r)
    assert record["metrics"]["head"]["workload"]["timed_runs"] == 6
    assert record["metrics"]["base"]["commit"] == main_sha
    assert record["metrics"]["head"]["commit"] == head_sha
    assert [h["decision"]["status"] for h in record["history"]] == ["inconclusive", "discard"]
    runs = Path(r.working_tree_dir) / "sandbox" / "runs"
    assert sorted(p.name for p in runs.iterdir()) == sorted(
        f"qwen3-slow-{sha[:8]}-{label}"
        for sha, label in [
            (main_sha, "base"),
            (head_sha, "head"),
            (main_sha, "base-rerun"),
            (head_sha, "head-rerun"),
        ]
    )
    assert r.git.worktree("list").count("\n") == 0  # the throwaway worktrees are gone
    assert _ledger(r)[-1] == LedgerRow(head_sha, 55.0, 48.0, "discard", "slow")


def test_sequential_sampling_adds_pairs_until_it_stops(repo, make_metrics, capsys):
    """The default: no rerun round, but more base/head pairs (alternating order, GROWTH times
    the runs each time, trimmed to the budget) until the pooled ratio's CI is decisive or the
    budget or the pair limit ends it; the decision says how many pairs and why it stopped."""
    r = repo
    _with_bench(r, make_metrics(cutile=(40.0, 60.0, 50.0)))
    main_sha = r.git.rev_parse("main")
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "slow")
    head_doc = make_metrics(coverage=55.0, cutile=(38.0, 58.0, 48.0))
    head_sha = _commit(r, {BENCH_TEMPLATE: json.dumps(head_doc)}, "slower kernel")
    capsys.readouterr()
    code = _cli(r, "experiment", "run", "--description", "slow", "--timeout", "60")
    out = capsys.readouterr()
    assert code == 0, out.err
    decision = json.loads(out.out)
    sampling = decision["sampling"]
    assert sampling["pairs"] >= 2, sampling
    assert sampling["stopped"] in ("decisive-slower", "budget", "max-pairs"), sampling
    assert sampling["runs"]["base"] == sampling["runs"]["head"] > 2
    assert decision["status"] == "discard"  # r = 0.96 < 0.98, settled without a rerun round
    assert decision["reasons"][-1].startswith(f"sampling: {sampling['pairs']} base/head pair(s)")
    assert "tilegym-bot: sampling: after 1 pair(s)" in out.err
    (record,) = _records(r)
    assert [h["decision"]["status"] for h in record["history"]] == ["discard"]
    assert record["metrics"]["head"]["workload"]["timed_runs"] == sampling["runs"]["head"]
    names = {p.name for p in (Path(r.working_tree_dir) / "sandbox" / "runs").iterdir()}
    assert {f"qwen3-slow-{main_sha[:8]}-base-2", f"qwen3-slow-{head_sha[:8]}-head-2"} <= names
    assert _ledger(r)[-1].status == "discard"


def test_an_interrupted_rerun_is_on_record_and_resumes(repo, make_metrics, tmp_path, capsys):
    """The inconclusive first round is saved before the rerun starts: killing `experiment run`
    during the rerun leaves an open record awaiting it, and the next run does only the rerun,
    with twice the first round's samples."""
    r = repo
    _with_bench(r, make_metrics(cutile=(40.0, 60.0, 50.0)))
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "slow")
    head_doc = make_metrics(coverage=55.0, cutile=(38.0, 58.0, 48.0))
    head_sha = _commit(r, {BENCH_TEMPLATE: json.dumps(head_doc)}, "slower kernel")
    pid_file = tmp_path / "bench.pid"
    env = {**os.environ, "HANG_AT_RUNS": "6", "HANG_PID_FILE": str(pid_file)}
    cmd = [sys.executable, "-m", "tilegym_bot", "-C", r.working_tree_dir, "experiment", "run"]
    cmd += ["--description", "slow", "--sampling-budget", "0"]
    cmd += ["--", "--device", "cpu", "--timed-runs", "3"]
    bot = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and bot.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert pid_file.exists(), "the rerun never started"
    finally:
        os.killpg(bot.pid, signal.SIGKILL)
        bot.wait(timeout=30)
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
    (record,) = _records(r)
    assert record["state"] == "open" and record["awaiting_rerun"] is True
    assert [h["decision"]["status"] for h in record["history"]] == ["inconclusive"]
    assert _ledger(r) == [] and r.tags == []
    # the killed run's benchmark worktrees (head and main's harness) are still registered
    assert r.git.worktree("list").count("tilegym-bot-wt-") == 2

    capsys.readouterr()
    assert _cli(r, "experiment", "run", "--description", "slow", "--", "--device", "cpu") == 0
    decision = json.loads(capsys.readouterr().out)
    assert decision["status"] == "discard"
    (record,) = _records(r)
    assert record["metrics"]["head"]["workload"]["timed_runs"] == 6
    assert [h["decision"]["status"] for h in record["history"]] == ["inconclusive", "discard"]
    assert _ledger(r)[-1] == LedgerRow(head_sha, 55.0, 48.0, "discard", "slow")
    assert "tilegym-bot-wt-" not in r.git.worktree("list")  # the next run pruned them


def test_head_moved_while_benchmarking_records_nothing(repo, make_metrics, capsys, monkeypatch):
    r = repo
    _with_bench(r, make_metrics())
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "moving")
    _commit(r, {BENCH_TEMPLATE: json.dumps(make_metrics(coverage=70.0))}, "kernel")
    main_sha = r.git.rev_parse("main")
    monkeypatch.setenv("MOVE_HEAD_IN", r.working_tree_dir)
    capsys.readouterr()
    assert _cli(r, "experiment", "run", "--description", "moving") == 1
    err = capsys.readouterr().err
    assert "moved while benchmarking" in err and "nothing was recorded" in err
    assert r.git.rev_parse("main") == main_sha and r.tags == []
    assert _records(r) == [] and _ledger(r) == []


def test_baseline_advance_and_more_refusals(repo, tmp_path, make_metrics, save_metrics, capsys):
    r = repo
    main0 = r.git.rev_parse("main")
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "base")
    head = save_metrics(tmp_path / "h.json", make_metrics(commit=main0))
    assert _cli(r, "experiment", "run", "--description", "b", "--head-metrics", str(head)) == 0
    assert _cli(r, "experiment", "advance") == 0 and r.active_branch.name == "main"
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "empty")
    msg = _refusal(
        r, capsys, "experiment", "run", "--description", "b", "--head-metrics", str(head)
    )
    assert "no commits beyond main" in msg
    ledger.ledger_path(Path(r.working_tree_dir), "qwen3").write_text("| broken |\n")
    capsys.readouterr()
    assert _cli(r, "ledger", "show", "--model-key", "qwen3") == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith(
        "qwen3_results.md:1: LEDGER001 expected the table line "
        "'| commit | cuTile coverage | cuTile throughput | status | description |',"
        " got '| broken |'"
    )
    assert err[-1].startswith("error: ")
