"""Red team against the local loop (findings a, b, e): what an experiment commits cannot steer
the judge. Real git repositories, real subprocesses."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import git
from conftest import LOOP_MODEL_DIR
from test_bot_local_loop import BENCH_TEMPLATE, _cli, _commit, _records, _with_bench
from tilegym_bot.forge.local import LocalForge
from tilegym_bot.runner.base import BenchRequest
from tilegym_bot.runner.local import LocalExecutor

PROJECT = Path(__file__).resolve().parents[2]
HARNESS_FILE = "modeling/transformers/src/tilegym_hf_bench/correctness.py"


def test_a_no_verify_commit_out_of_scope_is_refused_before_any_benchmark(
    repo, make_metrics, capsys
):
    """Finding a: a commit made with --no-verify (GitPython runs no hook) that changes the
    harness is refused by `experiment run` in seconds, naming the file; nothing benchmarked."""
    r = repo
    _with_bench(r, make_metrics())
    main_sha = r.git.rev_parse("main")
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "sneaky")
    _commit(
        r,
        {
            BENCH_TEMPLATE: json.dumps(make_metrics(coverage=70.0)),
            HARNESS_FILE: "REL_ERR_FACTOR = 1e9\n",
        },
        "kernel (and a wider tolerance)",
    )
    capsys.readouterr()
    started = time.monotonic()
    assert _cli(r, "experiment", "run", "--description", "x", "--", "--device", "cpu") == 1
    err = capsys.readouterr().err.splitlines()
    assert time.monotonic() - started < 30
    assert err[0] == f"{HARNESS_FILE}:1: SCOPE001 outside the scope of a 'qwen3' experiment"
    assert err[-1].startswith("error: experiment/qwen3/sneaky changes what a 'qwen3' experiment")
    assert "nothing was benchmarked" in err[-1]
    assert r.git.rev_parse("main") == main_sha
    assert not (Path(r.working_tree_dir) / "sandbox" / "runs").exists()
    assert _records(r) == []


def test_a_ci_workflow_change_is_refused(repo, make_metrics, capsys):
    r = repo
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "ci")
    _commit(r, {".github/workflows/bot.yml": "on: push\n"}, "ci")
    capsys.readouterr()
    assert _cli(r, "experiment", "run", "--description", "x", "--", "--device", "cpu") == 1
    assert ".github/workflows/bot.yml:1: SCOPE001" in capsys.readouterr().err


EVIL_BENCH = """\
import argparse, json, pathlib
parser = argparse.ArgumentParser()
for flag in ("--model-key", "--commit", "--metrics-out", "--device"):
    parser.add_argument(flag)
args = parser.parse_args()
pathlib.Path(args.metrics_out).write_text(json.dumps({"measured_by": "the experiment"}))
"""


def test_the_trusted_harness_measures_the_experiments_src(repo, make_metrics, tmp_path):
    """Finding b: the runner takes only src/ from the benchmarked commit; the benchmark harness
    (here a stand-in that reports which tree it came from) is main's, even when the head
    replaces it."""
    r = repo
    honest = make_metrics()
    _with_bench(r, honest)
    main_sha = r.git.rev_parse("main")
    r.git.checkout("-b", "experiment/qwen3/evil")
    head_sha = _commit(
        r, {"modeling/transformers/src/tilegym_hf_bench/_cli.py": EVIL_BENCH}, "own harness"
    )
    forge = LocalForge(Path(r.working_tree_dir))
    with forge.worktree(head_sha) as head_tree, forge.worktree(main_sha) as main_tree:
        request = BenchRequest(
            repo_dir=head_tree,
            commit=head_sha,
            bench_args=["--model-key", "qwen3", "--device", "cpu"],
            metrics_out=tmp_path / "m.json",
            log_dir=tmp_path / "logs",
            timeout_s=60,
            harness_dir=main_tree,
        )
        result = LocalExecutor(echo=False).run(request)
        measured = json.loads(result.metrics_path.read_text())
        assert "measured_by" not in measured and measured["commit"] == head_sha
        # the same head measured by its own harness (no trusted tree) is what the runner avoids
        request.harness_dir = None
        result = LocalExecutor(echo=False).run(request)
        assert result.status == "crash"


def _project_copy(dest: Path) -> git.Repo:
    """A repository whose main holds this project's current sources (the four packages)."""
    for rel in ("src", "modeling/transformers/src", "bot", "hooks"):
        shutil.copytree(
            PROJECT / rel, dest / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    (dest / "sandbox").mkdir()
    (dest / "sandbox" / ".gitignore").write_text("*\n!.gitignore\n")
    r = git.Repo.init(dest, initial_branch="main")
    with r.config_writer() as cfg:
        cfg.set_value("user", "name", "Test")
        cfg.set_value("user", "email", "test@example.com")
    r.git.add("-A")
    r.git.commit("-qm", "the project")
    return r


def test_the_bot_judges_with_mains_code_not_the_branchs(tmp_path):
    """Finding a/b at the bot itself: in an editable checkout the bot imports its code from the
    work tree, i.e. from the experiment's branch. A branch that disables the bot's own scope
    recheck is still refused, because `experiment run` re-executes itself from main."""
    r = _project_copy(tmp_path / "repo")
    root = Path(r.working_tree_dir)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            str(root / p) for p in ("src", "modeling/transformers/src", "bot", "hooks")
        ),
    }
    env.pop("TILEGYM_BOT_TRUSTED_TREE", None)
    bot = [sys.executable, "-m", "tilegym_bot", "-C", str(root)]
    subprocess.run(
        [*bot, "experiment", "start", "--model-key", "qwen3", "--name", "blind"],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    blind = root / "bot" / "tilegym_bot" / "trusted_tree.py"
    blind.write_text(
        blind.read_text() + "\n\ndef scope_refusals(*args, **kwargs):\n    return []\n"
    )
    r.git.commit("-qam", "a bot that sees nothing", "--no-verify")
    main_sha = r.git.rev_parse("main")
    started = time.monotonic()
    done = subprocess.run(
        [*bot, "experiment", "run", "--description", "x", "--", "--device", "cpu"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - started < 60
    assert "judging with main's code" in done.stderr
    assert re.search(r"^bot/tilegym_bot/trusted_tree.py:\d+: SCOPE001 ", done.stderr, re.M)
    assert "nothing was benchmarked" in done.stderr
    assert r.git.rev_parse("main") == main_sha
    assert not (root / "sandbox" / "runs").exists()


def test_a_run_in_a_linked_worktree_is_judged_by_mains_code(tmp_path):
    """The bot installed (editable) from the main working tree, which has another experiment
    checked out, that blinds the scope recheck; the run is in a linked worktree. The bot's code
    is in a working tree of the repository, so it still re-executes from main's snapshot."""
    r = _project_copy(tmp_path / "repo")
    root = Path(r.working_tree_dir)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            str(root / p) for p in ("src", "modeling/transformers/src", "bot", "hooks")
        ),
    }
    env.pop("TILEGYM_BOT_TRUSTED_TREE", None)
    r.git.checkout("-qb", "experiment/qwen3/blind")
    blind = root / "bot" / "tilegym_bot" / "trusted_tree.py"
    blind.write_text(
        blind.read_text() + "\n\ndef scope_refusals(*args, **kwargs):\n    return []\n"
    )
    r.git.commit("-qam", "a bot that sees nothing", "--no-verify")
    wt = tmp_path / "wt"
    r.git.worktree("add", "-b", "experiment/qwen3/ci", str(wt), "main")
    (wt / ".github" / "workflows").mkdir(parents=True)
    (wt / ".github" / "workflows" / "bot.yml").write_text("on: push\n")
    w = git.Repo(wt)
    w.git.add("-A")
    w.git.commit("-qm", "ci", "--no-verify")
    done = subprocess.run(
        [sys.executable, "-m", "tilegym_bot", "-C", str(wt), "experiment", "run"]
        + ["--description", "x", "--", "--device", "cpu"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "judging with main's code" in done.stderr
    assert ".github/workflows/bot.yml:1: SCOPE001" in done.stderr


def test_a_kernel_file_in_scope_still_runs_through_the_loop(repo, make_metrics, capsys):
    """The refusals are not a blanket: an experiment that changes only its model's files, with
    an honest cuTile kernel and faster numbers, is kept."""
    r = repo
    _with_bench(r, make_metrics())
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "honest")
    _commit(
        r,
        {
            BENCH_TEMPLATE: json.dumps(make_metrics(coverage=60.0)),
            f"{LOOP_MODEL_DIR}/kernels/extra.py": "import torch\n\nX = torch.zeros\n",
        },
        "kernel",
    )
    capsys.readouterr()
    assert _cli(r, "experiment", "run", "--description", "x", "--", "--device", "cpu") == 0
    assert json.loads(capsys.readouterr().out)["status"] == "keep"
