"""The ledger: exact format, header on first append, locked atomic appends, malformed files."""

from __future__ import annotations

import multiprocessing

import pytest
from tilegym_bot import ledger
from tilegym_bot.ledger import LedgerError, LedgerRow


def test_first_append_writes_header_and_exact_row(tmp_path):
    path = tmp_path / "sandbox" / "qwen3_results.md"
    assert ledger.append(path, LedgerRow("7241bf16aa", 49.2149, 53.405, "keep", "baseline"))
    assert path.read_text() == (
        "| commit | cuTile coverage | cuTile throughput | status | description |\n"
        "|:-------|----------------:|------------------:|:-------|:------------|\n"
        "| 7241bf16 | 49.21 | 53.41 | keep | baseline |\n"
    )


def test_empty_file_gets_header_and_crash_numbers_are_zero(tmp_path):
    path = tmp_path / "llama_results.md"
    path.write_text("\n")
    ledger.append(path, LedgerRow("0123abcd", None, float("nan"), "crash", "fused a|b\nrope"))
    rows = ledger.read(path)
    assert rows == [LedgerRow("0123abcd", 0.0, 0.0, "crash", "fused a|b rope")]
    assert (
        path.read_text().splitlines()[-1] == "| 0123abcd | 0.00 | 0.00 | crash | fused a\\|b rope |"
    )


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
