"""Hostile or clumsy input to the local loop gives one ``error:`` line and changes nothing; the
messages point to the command that can go on. Real git repositories, the CLI in process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bot_local_loop import _cli, _commit, _kernel_files, _metrics_files, _refusal, _snapshot


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize("name", ["ok..dots", "x.lock", "trailing.", "a.lock"])
def test_a_name_git_refuses_is_one_error_line(repo, capsys, name):
    before = _snapshot(repo)
    capsys.readouterr()
    assert _cli(repo, "experiment", "start", "--model-key", "qwen3", "--name", name) == 1
    line = _one_error_line(capsys)
    assert f"name {name!r} does not make a valid git ref" in line
    assert _snapshot(repo) == before


@pytest.mark.parametrize(
    "description",
    [
        "fused\n\nSigned-off-by: Mallory <m@example.com>",
        "tab\tseparated",
        "bidi \u202eoverride",
        "line\u2028separator",
    ],
)
def test_a_description_that_is_not_one_line_is_refused(
    repo, tmp_path, make_metrics, save_metrics, capsys, description
):
    _cli(repo, "experiment", "start", "--model-key", "qwen3", "--name", "evil")
    _commit(repo, _kernel_files("qwen3_evil"), "kernel")
    files = _metrics_files(tmp_path, save_metrics, make_metrics, repo, {}, {"coverage": 61.2})
    msg = _refusal(repo, capsys, "experiment", "run", "--description", description, *files)
    assert msg.startswith("error: --description must be one line of printable text")


def test_a_merge_message_is_one_line_without_trailers(
    repo, tmp_path, make_metrics, save_metrics, capsys
):
    _cli(repo, "experiment", "start", "--model-key", "qwen3", "--name", "fine")
    _commit(repo, _kernel_files("qwen3_fine"), "kernel")
    files = _metrics_files(tmp_path, save_metrics, make_metrics, repo, {}, {"coverage": 61.2})
    description = "  fused RMSNorm: Signed-off-by: nobody  "
    assert _cli(repo, "experiment", "run", "--description", description, *files) == 0
    body = repo.git.log("-1", "--format=%B", "main").strip()
    assert body == (
        "Merge experiment/qwen3/fine: fused RMSNorm: Signed-off-by: nobody (keep, PR #1)"
    )
    assert repo.git.log("-1", "--format=%(trailers)", "main").strip() == ""


def test_advance_after_a_scope_refusal_points_to_reset(repo, capsys):
    r = repo
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "ci")
    _commit(r, {".github/workflows/bot.yml": "on: push\n"}, "ci")
    capsys.readouterr()
    assert _cli(r, "experiment", "run", "--description", "x", "--", "--device", "cpu") == 1
    msg = _refusal(r, capsys, "experiment", "advance")
    assert "`experiment run` refuses it (1 scope finding(s)" in msg
    assert "`tilegym-bot experiment reset` abandons it" in msg
    assert "run `tilegym-bot experiment run`" not in msg
    assert _cli(r, "experiment", "reset") == 0 and r.active_branch.name == "main"


def test_a_model_added_on_its_model_branch_says_merge_it_first(repo, capsys):
    """`model init` commits a new model on model/<key>: until that is merged, the benchmark
    does not know the key, and the way on is that merge, not editing presets by hand."""
    repo.git.branch("model/newfamily")
    before = _snapshot(repo)
    capsys.readouterr()
    assert _cli(repo, "experiment", "start", "--model-key", "newfamily", "--name", "x") == 1
    line = _one_error_line(capsys)
    assert "added by `tilegym-bot model init` on branch model/newfamily" in line
    assert "git merge model/newfamily" in line and "presets.py" not in line
    assert _snapshot(repo) == before


def test_a_baseline_run_says_it_is_not_a_verdict(
    repo, tmp_path, make_metrics, save_metrics, capsys
):
    main0 = repo.git.rev_parse("main")
    _cli(repo, "experiment", "start", "--model-key", "qwen3", "--name", "baseline")
    head = save_metrics(tmp_path / "h.json", make_metrics(commit=main0))
    capsys.readouterr()
    assert (
        _cli(repo, "experiment", "run", "--description", "main", "--head-metrics", str(head)) == 0
    )
    out = capsys.readouterr()
    assert json.loads(out.out)["status"] == "keep"
    assert (
        f"baseline: main ({main0[:8]}) measured as it is and recorded as the first row of the "
        "qwen3 ledger" in out.err
    )
    assert '"status": "keep" below is that row\'s, not a verdict on an experiment' in out.err
    assert Path(repo.working_tree_dir, "sandbox", "qwen3_results.md").is_file()
