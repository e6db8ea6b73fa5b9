"""The ledger: exact format, header on first append, locked atomic appends, malformed files,
and ``n/a`` (never 0.00) for what was not measured, in the ledger, its plot and its rebuild."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from tilegym_bot import ledger
from tilegym_bot.cli import main
from tilegym_bot.errors import BotError
from tilegym_bot.ledger import LedgerError, LedgerRow
from tilegym_bot.plot import plot_ledger, series
from tilegym_bot.rebuild import rows_from_records


def test_first_append_writes_header_and_exact_row(tmp_path):
    path = tmp_path / "sandbox" / "qwen3_results.md"
    assert ledger.append(path, LedgerRow("7241bf16aa", 49.2149, 53.405, "keep", "baseline"))
    assert path.read_text() == (
        "| commit | cuTile coverage | cuTile throughput | status | description |\n"
        "|:-------|----------------:|------------------:|:-------|:------------|\n"
        "| 7241bf16 | 49.21 | 53.41 | keep | baseline |\n"
    )


def test_empty_file_gets_header_and_unmeasured_numbers_are_n_a(tmp_path):
    path = tmp_path / "llama_results.md"
    path.write_text("\n")
    ledger.append(path, LedgerRow("0123abcd", None, float("nan"), "crash", "fused a|b\nrope"))
    rows = ledger.read(path)
    assert rows == [LedgerRow("0123abcd", None, None, "crash", "fused a|b rope")]
    assert (
        path.read_text().splitlines()[-1] == "| 0123abcd | n/a | n/a | crash | fused a\\|b rope |"
    )


def test_a_measured_zero_and_an_unmeasured_value_stay_apart(tmp_path):
    """A CPU run: throughput measured as 0.00 is a number, coverage never measured is n/a."""
    path = tmp_path / "qwen3_results.md"
    ledger.append(path, LedgerRow("0123abcd", None, 0.0, "keep", "baseline"))
    ledger.append(path, LedgerRow("4567cdef", float("inf"), 12.5, "discard", "cpu"))
    assert path.read_text().splitlines()[2:] == [
        "| 0123abcd | n/a | 0.00 | keep | baseline |",
        "| 4567cdef | n/a | 12.50 | discard | cpu |",
    ]
    assert [(r.coverage, r.throughput) for r in ledger.read(path)] == [(None, 0.0), (None, 12.5)]


def test_an_old_ledger_with_zeros_for_crashes_still_reads(tmp_path):
    path = tmp_path / "qwen3_results.md"
    path.write_text(ledger.render([]) + "| 0123abcd | 0.00 | 0.00 | crash | before n/a |\n")
    ledger.append(path, LedgerRow("4567cdef", None, None, "crash", "after"))
    assert ledger.read(path) == [
        LedgerRow("0123abcd", 0.0, 0.0, "crash", "before n/a"),
        LedgerRow("4567cdef", None, None, "crash", "after"),
    ]


@pytest.mark.parametrize("value", ["0.00", "-", True, [1.0]])
def test_a_ledger_number_is_a_number_or_none(value):
    with pytest.raises(ValueError, match="must be a number or 'n/a'"):
        LedgerRow("0123abcd", value, 1.0, "keep", "x")


def test_skip_if_commit_present(tmp_path):
    path = tmp_path / "k_results.md"
    row = LedgerRow("deadbeef", 1.0, 2.0, "discard", "x")
    assert ledger.append(path, row, skip_if_commit_present=True)
    assert not ledger.append(path, row, skip_if_commit_present=True)
    assert len(ledger.read(path)) == 1


@pytest.mark.parametrize(
    "text, line, code",
    [
        ("| commit | coverage |\n", 1, "LEDGER001"),
        (ledger.render([]) + "| 7241bf16 | 49.21 | 53.41 | keep |\n", 3, "LEDGER002"),
        (ledger.render([]) + "not a row\n", 3, "LEDGER002"),
        (ledger.render([]) + "| 7241BF16 | 49.21 | 53.41 | keep | x |\n", 3, "LEDGER003"),
        (ledger.render([]) + "| 7241bf16 | 49.2 | 53.41 | keep | x |\n", 3, "LEDGER004"),
        (ledger.render([]) + "| 7241bf16 | N/A | 53.41 | keep | x |\n", 3, "LEDGER004"),
        (ledger.render([]) + "| 7241bf16 | 49.21 | - | keep | x |\n", 3, "LEDGER004"),
        (ledger.render([]) + "| 7241bf16 | 49.21 | 53.41 | incorrect | x |\n", 3, "LEDGER005"),
        (ledger.render([]) + "| 7241bf16 | 49.21 | 53.41 | keep |  |\n", 3, "LEDGER006"),
    ],
)
def test_malformed_ledger_is_reported_and_left_untouched(tmp_path, text, line, code):
    path = tmp_path / "qwen3_results.md"
    path.write_text(text)
    with pytest.raises(LedgerError) as info:
        ledger.append(path, LedgerRow("11111111", 1.0, 1.0, "keep", "x"))
    first = str(info.value.findings[0])
    assert first.startswith(f"{path}:{line}: {code} "), first
    assert path.read_text() == text


def _append_many(path, worker, count):
    for i in range(count):
        ledger.append(path, LedgerRow(f"{worker:02x}{i:06x}", i, i, "discard", f"w{worker} #{i}"))


def test_concurrent_appends_from_two_processes_lose_no_row(tmp_path):
    path = tmp_path / "sandbox" / "qwen3_results.md"
    count = 60
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(path, w, count)) for w in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    rows = ledger.read(path)
    assert len(rows) == 2 * count
    assert {r.commit for r in rows} == {f"{w:02x}{i:06x}" for w in (1, 2) for i in range(count)}
    assert path.read_text().count("| commit |") == 1


def test_rewrite_replaces_the_table(tmp_path):
    path = tmp_path / "m_results.md"
    ledger.append(path, LedgerRow("aaaaaaaa", 1, 1, "keep", "old"))
    ledger.rewrite(path, [LedgerRow("bbbbbbbb", 2, 3, "discard", "new")])
    assert ledger.read(path) == [LedgerRow("bbbbbbbb", 2.0, 3.0, "discard", "new")]


def test_the_plot_leaves_out_what_was_not_measured(tmp_path):
    rows = [
        LedgerRow("aaaaaaaa", 49.2, 53.4, "keep", "baseline"),
        LedgerRow("bbbbbbbb", None, None, "crash", "crashed"),
        LedgerRow("cccccccc", None, 21.0, "keep", "cpu"),
    ]
    assert series(rows, "coverage") == {"keep": [(1, 49.2)]}
    assert series(rows, "throughput") == {"keep": [(1, 53.4), (3, 21.0)]}
    nothing = [LedgerRow("dddddddd", None, None, "crash", "x")]
    assert series(nothing, "coverage") == {}
    out = plot_ledger(nothing, tmp_path / "p.png", title="t")
    assert out.read_bytes().startswith(b"\x89PNG")


def test_loop_and_rebuild_write_n_a_for_unmeasured_values(
    repo, tmp_path, make_metrics, save_metrics, capsys
):
    """A run measured without cuTile (a CPU run: no coverage, no cuTile throughput) goes into
    the ledger as n/a, through the loop and through `ledger rebuild` from the PR records."""
    root = repo.working_tree_dir
    main_sha = repo.git.rev_parse("main")
    assert main(["-C", root, "experiment", "start", "--model-key", "qwen3", "--name", "cpu"]) == 0
    head = save_metrics(
        tmp_path / "h.json", make_metrics(commit=main_sha, coverage=None, cutile=None)
    )
    run = ["experiment", "run", "--description", "cpu", "--head-metrics", str(head)]
    assert main(["-C", root, *run]) == 0
    path = ledger.ledger_path(Path(root), "qwen3")
    written = path.read_text()
    assert written.splitlines()[2].startswith(f"| {main_sha[:8]} | n/a | n/a | ")
    assert ledger.read(path)[0].coverage is None
    path.unlink()
    assert main(["-C", root, "ledger", "rebuild", "--model-key", "qwen3"]) == 0
    assert path.read_text() == written
    png = tmp_path / "ledger.png"
    capsys.readouterr()
    assert main(["-C", root, "ledger", "show", "--model-key", "qwen3", "--plot", str(png)]) == 0
    assert "| n/a | n/a |" in capsys.readouterr().out and png.is_file()


def test_rebuild_refuses_a_record_that_is_no_ledger_row_in_one_line():
    record = {"model_key": "qwen3", "pr": 7, "head_sha": "a" * 40, "coverage": "lots",
              "throughput": 1.0, "ledger_status": "keep", "description": "x"}  # fmt: skip
    with pytest.raises(BotError, match=r"^PR #7: its embedded record is not a ledger row \("):
        rows_from_records([record], "qwen3")
