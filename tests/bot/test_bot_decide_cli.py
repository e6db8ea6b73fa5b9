"""``tilegym-bot decide`` as a real subprocess: JSON contract, readable summary, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tilegym_bot.cli import main

BASE = "a" * 40


def _run(*args, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "tilegym_bot.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_decide_json_and_summary(tmp_path, make_metrics, save_metrics):
    base = save_metrics(tmp_path / "b.json", make_metrics(commit=BASE))
    head = save_metrics(tmp_path / "h.json", make_metrics(coverage=61.2))
    proc = _run("decide", "--base", str(base), "--head", str(head), "--json", "--trust-metrics")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("warning: ") and "--trust-metrics" in proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["status"] == "keep" and doc["ledger_status"] == "keep"
    assert doc["coverage"]["delta_pp"] == 61.2 - 50.0
    lo, hi = doc["throughput"]["ratio_ci95"]
    assert lo < doc["throughput"]["ratio"] == 1.0 < hi

    proc = _run("decide", "--base", str(base), "--head", str(head), "--margin", "0.5",
                "--trust-metrics")  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.startswith("verdict: keep (ledger: keep)")
    assert "coverage: 50.00% → 61.20%" in proc.stdout


def _in_process(capsys, *args):
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def test_decide_bad_inputs_are_one_error_line(tmp_path, make_metrics, save_metrics, capsys):
    base = save_metrics(tmp_path / "b.json", make_metrics(commit=BASE))
    broken = tmp_path / "broken.json"
    broken.write_text("{\n  not json")
    cases = [
        (["--base", str(base), "--head", str(broken)], f"error: {broken}:2: not JSON"),
        (["--base", str(base), "--head", str(tmp_path / "missing.json")], "error: "),
        (["--base", str(base)], "error: the following arguments are required: --head"),
        (["--base", str(base), "--head", str(base), "--margin", "2"], "error: argument --margin"),
    ]
    for args, start in cases:
        code, err = _in_process(capsys, "decide", *args)
        assert code == 2, (args, err)
        assert err.startswith(start) and err.count("\n") == 1, err
    proc = _run("decide", *cases[0][0])  # and once as a real process: no traceback
    assert proc.returncode == 2 and proc.stderr.startswith(cases[0][1])
    assert "Traceback" not in proc.stderr

    # A schema-invalid file is not a usage error: the decision is inconclusive with the reason.
    bad = save_metrics(tmp_path / "bad.json", {"schema": "tilegym-bench-metrics/1"})
    code = main(["decide", "--base", str(base), "--head", str(bad), "--json", "--trust-metrics"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "inconclusive" and "rejected by the schema" in doc["reasons"][0]


def test_decide_recounts_with_the_kernels_of_the_measured_commits(
    repo, tmp_path, make_metrics, save_metrics, capsys
):
    """--repo: the commits the metrics name decide what coverage counts. At a commit without
    the ``rms_norm_kernel`` function, the file's cuTile kernel is not cuTile: refused."""
    main_sha = repo.git.rev_parse("HEAD")
    (Path(repo.working_tree_dir) / "src/tilegym/transformers/qwen3/kernels/rms_norm.py").write_text(
        "def rms_norm_kernel(x):\n    pass\n"
    )
    repo.git.commit("-qam", "no longer a cuTile kernel")
    other = repo.git.rev_parse("HEAD")
    base = save_metrics(tmp_path / "b.json", make_metrics(commit=main_sha))
    head = save_metrics(tmp_path / "h.json", make_metrics(commit=main_sha, coverage=61.2))
    code, _ = _in_process(capsys, "decide", "--base", str(base), "--head", str(head), "--repo",
                          repo.working_tree_dir, "--json")  # fmt: skip
    assert code == 0
    head = save_metrics(tmp_path / "h.json", make_metrics(commit=other, coverage=61.2))
    main(["decide", "--base", str(base), "--head", str(head), "--repo", repo.working_tree_dir])
    out = capsys.readouterr().out
    assert out.startswith("verdict: inconclusive") and "head metrics refused" in out


def test_decide_summary_says_n_a_for_what_was_not_measured(tmp_path, make_metrics, save_metrics):
    base = save_metrics(tmp_path / "b.json", make_metrics(commit=BASE, coverage=None))
    head = save_metrics(tmp_path / "h.json", make_metrics(coverage=None))
    proc = _run("decide", "--base", str(base), "--head", str(head), "--trust-metrics")
    assert proc.returncode == 0, proc.stderr
    assert "coverage: n/a → n/a (Δ n/a)" in proc.stdout and "n/a%" not in proc.stdout


def test_decide_refuses_commits_it_cannot_find(repo, tmp_path, make_metrics, save_metrics):
    """A measured commit missing from --repo: its kernels cannot be read, so the file's own
    kernel list would decide coverage. Refused in one error line unless --trust-metrics."""
    main_sha = repo.git.rev_parse("HEAD")
    base = save_metrics(tmp_path / "b.json", make_metrics(commit=main_sha))
    head = save_metrics(tmp_path / "h.json", make_metrics(commit="c" * 40, coverage=61.2))
    args = ["decide", "--base", str(base), "--head", str(head), "--repo", repo.working_tree_dir]
    proc = _run(*args, "--json")
    assert proc.returncode == 1 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: {head}: commit 'cccc") and "--trust-metrics" in line
    proc = _run(*args, "--json", "--trust-metrics")
    assert proc.returncode == 0 and json.loads(proc.stdout)["status"] == "keep"
    proc = _run("decide", "--base", str(base), "--head", str(head), "--repo", str(tmp_path))
    assert proc.returncode == 1 and "is not inside a git repository" in proc.stderr
    assert proc.stderr.count("\n") == 1
