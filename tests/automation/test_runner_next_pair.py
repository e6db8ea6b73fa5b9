"""``runner next-pair``: the GitHub job's sequential sampling step, on plain metrics files made
from the committed noisy-host measurements that ``scripts/replay_decisions.py`` replays."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from tilegym_bot import replay as rp
from tilegym_bot.runner.base import BenchRequest, synthesize_metrics
from tilegym_bot.runner.cli import main

ROOT = Path(__file__).resolve().parents[2]
# llama, static mode, 10 interleaved runs a side; run CV 6-8% (docs/results/.../README.md)
NOISY = ROOT / "docs/results/h200-2026-12-02-kept-cache/bench-static-llama-10runs.json"


@pytest.fixture(scope="module")
def prepared() -> rp.Prepared:
    """Base and head templates of the noisy file; the head gains 0.05 pp coverage, so the
    decision reaches the throughput rule (``replay.prepare``)."""
    return rp.prepare(json.loads(NOISY.read_text()))


def side(template: dict, runs: int, factor: float = 1.0, offset: int = 0) -> dict:
    """``template`` with ``runs`` of its measured runs (cycling from ``offset``), its cuTile
    speed scaled by ``factor``."""
    measured = template["workload"]["timed_runs"]
    idx = tuple((offset + i) % measured for i in range(runs))
    return rp._side(template, idx, measured, factor)


def write_pair(folder: Path, k: int, base: dict, head: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    suffix = "" if k == 1 else f"-{k}"
    (folder / f"base{suffix}.json").write_text(json.dumps(base))
    (folder / f"head{suffix}.json").write_text(json.dumps(head))


def ask(folder: Path, capsys, *, budget=900, elapsed=300.0, extra=()) -> dict[str, str]:
    capsys.readouterr()
    started = str(time.time() - elapsed)
    rc = main(
        ["runner", "next-pair", str(folder), "--budget", str(budget), "--started-at", started]
        + list(extra)
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    return dict(line.split("=", 1) for line in out.splitlines())


def test_a_noisy_first_pair_asks_for_a_second_with_growth_times_the_runs_base_first(
    tmp_path, prepared, capsys
):
    write_pair(tmp_path, 1, prepared.base, prepared.head)
    got = ask(tmp_path, capsys, extra=["--github-output", str(tmp_path / "gh")])
    assert (got["stop"], got["pairs"], got["next"], got["runs"], got["first"]) == (
        "false",
        "1",
        "2",
        "80",  # 10 runs a side, times sequential.GROWTH (8); it fits in the 600 s left
        "base",
    )
    assert got["why"].startswith("after 1 pair(s): r = 1.000 (95% CI ")
    assert got["why"].endswith("not decisive; next pair 80 runs a side")
    lines = (tmp_path / "gh").read_text().splitlines()
    assert lines == [f"{k}={v}" for k, v in got.items()]


def test_the_third_pair_puts_the_head_first(tmp_path, prepared, capsys):
    write_pair(tmp_path, 1, prepared.base, prepared.head)
    # A second pair as noisy as the first (the same runs again): still not decisive.
    write_pair(tmp_path, 2, side(prepared.base, 10), side(prepared.head, 10))
    got = ask(tmp_path, capsys, elapsed=400.0)
    assert (got["stop"], got["pairs"], got["next"], got["first"]) == ("false", "2", "3", "head")


def test_a_clear_slowdown_stops_at_once(tmp_path, prepared, capsys):
    write_pair(tmp_path, 1, prepared.base, side(prepared.head, 10, factor=0.80))
    got = ask(tmp_path, capsys)
    assert (got["stop"], got["stopped"]) == ("true", "decisive-slower")
    assert "next" not in got and "the whole interval below it" in got["why"]


def test_a_first_pair_decided_by_another_rule_stops(tmp_path, prepared, capsys):
    # The same document on both sides: no coverage gain, a rule-8 discard before throughput.
    write_pair(tmp_path, 1, prepared.base, prepared.base)
    got = ask(tmp_path, capsys)
    assert (got["stop"], got["stopped"], got["why"]) == (
        "true",
        "decided-before-throughput",
        "decided by another rule: discard",
    )


def test_the_budget_stops_a_pair_that_would_not_fit(tmp_path, prepared, capsys):
    write_pair(tmp_path, 1, prepared.base, prepared.head)
    got = ask(tmp_path, capsys, elapsed=800.0)  # a pair of this file takes ~2 x 92 s at least
    assert (got["stop"], got["stopped"]) == ("true", "budget")
    assert "does not fit in the" in got["why"]
    assert ask(tmp_path, capsys, budget=0, elapsed=1.0)["stopped"] == "budget"


def test_a_later_pair_that_crashed_is_rejected(tmp_path, prepared, capsys):
    write_pair(tmp_path, 1, prepared.base, prepared.head)
    args = ["--model-key", "llama", "--device", "cuda"]
    req = BenchRequest(Path("."), prepared.head["commit"], args, Path("m"), Path("."))
    crash = synthesize_metrics(req, "crash", "boom", "2026-12-02T12:10:00+00:00", 3.0)
    write_pair(tmp_path, 2, side(prepared.base, 20), crash)
    got = ask(tmp_path, capsys)
    assert (got["stop"], got["stopped"]) == ("true", "pair-rejected")
    assert got["why"].startswith("head benchmark ended with crash")


def _error(capsys, argv) -> tuple[int, list[str]]:
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    return rc, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    ("setup", "flags", "rc", "message"),
    [
        ("half", [], 1, "error: pair 2 in {dir} is not whole: head-2.json is missing"),
        ("none", [], 1, "error: no pair in {dir}: base.json and head.json are missing"),
        ("broken", [], 1, "error: {dir}/head.json is not readable JSON"),
        ("pair", ["--budget", "-1"], 2, "error: --budget must be a finite number"),
        ("pair", ["--margin", "1.5"], 2, "error: --margin must be in [0, 1)"),
        ("pair", ["--started-at", "9e12"], 2, "error: --started-at 9000000000000.0 is not a past"),
        ("pair", ["--base-repo", "."], 2, "error: --base-repo and --head-repo go together"),
        ("pair", ["--budget", "x"], 2, "error: argument --budget: invalid float value"),
    ],
)
def test_bad_input_is_one_error_line(tmp_path, prepared, capsys, setup, flags, rc, message):
    folder = tmp_path / "a"
    folder.mkdir()
    if setup in ("half", "pair", "broken"):
        write_pair(folder, 1, prepared.base, prepared.head)
    if setup == "half":
        (folder / "base-2.json").write_text(json.dumps(prepared.base))
    if setup == "broken":
        (folder / "head.json").write_text("{oops")
    argv = ["runner", "next-pair", str(folder), "--budget", "900", "--started-at", "1"]
    got_rc, err = _error(capsys, [*argv, *flags])
    assert got_rc == rc and len(err) == 1, err
    assert err[0].startswith(message.format(dir=folder)), err
