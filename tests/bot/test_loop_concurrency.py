"""The local loop against concurrent runs: real git repositories and worktrees, real
``tilegym-bot`` subprocesses started together. The test holds the PR-record lock while both
runs start, so both have decided (and passed every check before the merge) when it lets them go:
the race that merged a tree nobody benchmarked happens every time, not one try in three."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import git
import pytest
from filelock import FileLock
from test_bot_local_loop import _cli, _commit, _kernel_files, _ledger, _records
from tilegym_bot import ledger
from tilegym_bot.cli import main
from tilegym_bot.errors import BotError
from tilegym_bot.forge.local import LocalForge
from tilegym_bot.report import parse_record


def _bot(cwd: str, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tilegym_bot", "-C", cwd, *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _cpu_ticks(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


def _has_children(pid: int) -> bool:
    try:
        return bool(Path(f"/proc/{pid}/task/{pid}/children").read_text().strip())
    except OSError:
        return False


def _wait_until_blocked(procs: list[subprocess.Popen], timeout: float = 45.0) -> None:
    """Until each process has exited or sits idle (no child, no CPU for a second): waiting on
    the lock the test holds. Only the old code's failure depends on this being exact."""
    deadline = time.monotonic() + timeout
    quiet = {p.pid: 0 for p in procs}
    last = {p.pid: None for p in procs}
    while time.monotonic() < deadline:
        for p in procs:
            ticks = None if p.poll() is not None else _cpu_ticks(p.pid)
            if ticks is None:
                quiet[p.pid] = 99
            elif ticks == last[p.pid] and not _has_children(p.pid):
                quiet[p.pid] += 1
            else:
                quiet[p.pid] = 0
            last[p.pid] = ticks
        if all(n >= 5 for n in quiet.values()):
            return
        time.sleep(0.25)


@contextlib.contextmanager
def _pr_locks_held(r: git.Repo, *worktrees: Path):
    """The PR-record lock of every place a bot could keep it (the common dir, and each
    worktree's own git dir, where the code before one-state-per-repository kept it)."""
    git_dirs = [Path(r.git_dir)] + [Path(git.Repo(w).git_dir) for w in worktrees]
    locks = []
    for d in git_dirs:
        (d / "tilegym-bot" / "prs").mkdir(parents=True, exist_ok=True)
        locks.append(FileLock(str(d / "tilegym-bot" / "prs.lock")))
    with contextlib.ExitStack() as stack:
        for lock in locks:
            stack.enter_context(lock)
        yield


def _metrics(tmp_path, save_metrics, make_metrics, base_sha, head_sha, tag, coverage=61.2):
    base = save_metrics(tmp_path / f"base-{tag}.json", make_metrics(commit=base_sha))
    head = save_metrics(
        tmp_path / f"head-{tag}.json", make_metrics(commit=head_sha, coverage=coverage)
    )
    return ["--base-metrics", str(base), "--head-metrics", str(head)]


def _finish(procs, timeout=120):
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        results.append((p.returncode, out, err))
    return results


def test_two_concurrent_keeps_merge_at_most_one(repo, tmp_path, make_metrics, save_metrics):
    """Two keeps measured against the same main, one run in a linked worktree: one merges, the
    other merges nothing and says rebench (exit 1, one error line, no ledger row, its record
    open again); its next run benchmarks against the new main."""
    r = repo
    main0 = r.git.rev_parse("main")
    wt = tmp_path / "wt"
    r.git.worktree("add", "--detach", str(wt), "main")
    w = git.Repo(wt)
    assert _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "a") == 0
    head_a = _commit(r, _kernel_files("qwen3_a"), "a")
    assert main(["-C", str(wt), "experiment", "start", "--model-key", "qwen3", "--name", "b"]) == 0
    head_b = _commit(w, _kernel_files("qwen3_b"), "b")
    files_a = _metrics(tmp_path, save_metrics, make_metrics, main0, head_a, "a")
    files_b = _metrics(tmp_path, save_metrics, make_metrics, main0, head_b, "b")

    with _pr_locks_held(r, wt):
        procs = [
            _bot(r.working_tree_dir, "experiment", "run", "--description", "a", *files_a),
            _bot(str(wt), "experiment", "run", "--description", "b", *files_b),
        ]
        _wait_until_blocked(procs)
    results = _finish(procs)

    merged = [h for h in (head_a, head_b) if r.is_ancestor(h, "main")]
    assert len(merged) == 1, results
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 1], results
    (lost,) = [(code, out, err) for code, out, err in results if code == 1]
    assert lost[1] == "" and lost[2].count("\n") == 1, lost
    assert lost[2].startswith(f"error: rebench: main moved from {main0[:8]} to ")
    assert "experiment run` again" in lost[2]
    new_main = r.commit("main")
    assert [p.hexsha for p in new_main.parents] == [main0, merged[0]]

    records = {rec["head_sha"]: rec for rec in _records(r)}
    loser = head_b if merged[0] == head_a else head_a
    assert records[merged[0]]["state"] == "merged"
    assert records[loser]["state"] == "open" and records[loser]["rebench"]["measured"] == main0
    assert [row.commit for row in _ledger(r)] == [main0[:8], merged[0][:8]]
    assert "not merged: main moved" in records[loser]["comment"]
    assert parse_record(records[loser]["comment"])["final"] is False  # ledger rebuild skips it

    # the loser's next run is against the new main: the old base metrics are refused as stale
    loser_dir = r.working_tree_dir if loser == head_a else str(wt)
    stale = files_a if loser == head_a else files_b
    assert main(["-C", loser_dir, "experiment", "run", "--description", "x", *stale]) == 1
    fresh = _metrics(tmp_path, save_metrics, make_metrics, new_main.hexsha, loser, "fresh", 70.0)
    assert main(["-C", loser_dir, "experiment", "run", "--description", "x", *fresh]) == 0
    assert r.is_ancestor(loser, "main") and r.is_ancestor(merged[0], "main")
    assert [row.commit for row in _ledger(r)][-1] == loser[:8]


def test_two_runs_of_one_branch_write_one_record(repo, tmp_path, make_metrics, save_metrics):
    r = repo
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "twice")
    head = _commit(r, _kernel_files("qwen3_twice"), "twice")
    files = _metrics(tmp_path, save_metrics, make_metrics, r.git.rev_parse("main"), head, "t")
    with _pr_locks_held(r):
        procs = [
            _bot(r.working_tree_dir, "experiment", "run", "--description", "t", *files)
            for _ in range(2)
        ]
        _wait_until_blocked(procs)
    results = _finish(procs)
    assert [(rec["branch"], rec["head_sha"]) for rec in _records(r)] == [
        ("experiment/qwen3/twice", head)
    ], results
    for code, _, err in results:
        assert code == 0 or (
            err.count("\n") == 1 and "another `experiment run` of experiment/qwen3/twice" in err
        ), err


def test_one_ledger_and_pr_numbering_per_repository(repo, tmp_path, make_metrics, save_metrics):
    """A run in a linked worktree writes the repository's ledger and numbers its PR after the
    main tree's: nothing is lost when the worktree is removed."""
    r = repo
    main0 = r.git.rev_parse("main")
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "main-side")
    head_a = _commit(r, _kernel_files("qwen3_a"), "a")
    files = _metrics(tmp_path, save_metrics, make_metrics, main0, head_a, "a", coverage=50.0)
    assert _cli(r, "experiment", "run", "--description", "a", *files) == 0  # discard
    wt = tmp_path / "wt"
    r.git.worktree("add", "--detach", str(wt), "main")
    w = git.Repo(wt)
    assert main(["-C", str(wt), "experiment", "start", "--model-key", "qwen3", "--name", "b"]) == 0
    head_b = _commit(w, _kernel_files("qwen3_b"), "b")
    files = _metrics(tmp_path, save_metrics, make_metrics, main0, head_b, "b")
    assert main(["-C", str(wt), "experiment", "run", "--description", "b", *files]) == 0
    r.git.worktree("remove", "--force", str(wt))
    assert [(rec["number"], rec["head_sha"]) for rec in _records(r)] == [(1, head_a), (2, head_b)]
    assert [row.commit for row in _ledger(r)] == [main0[:8], head_a[:8], head_b[:8]]
    assert not (wt / "sandbox").exists()
    assert main(["-C", r.working_tree_dir, "ledger", "show", "--model-key", "qwen3"]) == 0


def _registered(r: git.Repo) -> list[str]:
    listing = r.git.worktree("list", "--porcelain")
    return [line.split(" ", 1)[1] for line in listing.splitlines() if line.startswith("worktree ")]


HOLD_A_WORKTREE = """\
import sys, time
from tilegym_bot.errors import BotError
from tilegym_bot.forge.local import LocalForge
from tilegym_bot.report import parse_record
with LocalForge(sys.argv[1]).worktree(sys.argv[2]) as path:
    print(path, flush=True)
    time.sleep(120)
"""


def test_worktrees_of_killed_runs_are_pruned(repo, tmp_path, make_metrics, save_metrics, capsys):
    """A benchmark worktree of a run killed with SIGKILL stays registered; the next run drops
    it, and one whose directory is gone, but not the worktree of a live run nor the user's."""
    r = repo
    main0 = r.git.rev_parse("main")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_A_WORKTREE, r.working_tree_dir, main0],
        stdout=subprocess.PIPE,
        text=True,
    )
    killed = Path(holder.stdout.readline().strip())
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    assert killed.is_dir() and str(killed) in _registered(r)

    gone = tmp_path / "tilegym-bot-wt-gone"
    r.git.worktree("add", "--detach", str(gone), main0)
    r.git.worktree("lock", "--reason", f"tilegym-bot pid={os.getpid()} start=- host=x", str(gone))
    user_wt = tmp_path / "mine"
    r.git.worktree("add", "--detach", str(user_wt), main0)
    shutil.rmtree(gone)

    with LocalForge(r.working_tree_dir).worktree(main0) as live:
        _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "after-kill")
        head = _commit(r, _kernel_files("qwen3_k"), "k")
        files = _metrics(tmp_path, save_metrics, make_metrics, main0, head, "k")
        capsys.readouterr()
        assert _cli(r, "experiment", "run", "--description", "k", *files) == 0
        err = capsys.readouterr().err
        assert "pruned 2 orphaned bot worktree(s)" in err, err
        assert sorted(_registered(r)) == sorted([r.working_tree_dir, str(user_wt), str(live)]), (
            _registered(r)
        )
    assert not killed.exists()
    assert sorted(_registered(r)) == sorted([r.working_tree_dir, str(user_wt)])
    assert ledger.read(ledger.ledger_path(Path(r.working_tree_dir), "qwen3"))[-1].commit == head[:8]


def test_a_second_new_record_of_one_branch_and_sha_is_refused(repo, tmp_path):
    """The record store itself keeps one live record per branch + SHA (a run that bypassed the
    run lock, e.g. from an older bot, cannot add a second)."""
    wt = tmp_path / "wt"
    repo.git.worktree("add", "--detach", str(wt), "main")
    sha = repo.git.rev_parse("main")
    first = LocalForge(repo.working_tree_dir).save_pr(
        {"number": None, "branch": "experiment/qwen3/x", "head_sha": sha}
    )
    assert first["number"] == 1
    second = {"number": None, "branch": "experiment/qwen3/x", "head_sha": sha}
    with pytest.raises(BotError, match=r"PR record #1 of experiment/qwen3/x"):
        LocalForge(wt).save_pr(second)
    other = LocalForge(wt).save_pr(
        {"number": None, "branch": "experiment/qwen3/y", "head_sha": sha}
    )
    assert other["number"] == 2 and [r["number"] for r in _records(repo)] == [1, 2]
