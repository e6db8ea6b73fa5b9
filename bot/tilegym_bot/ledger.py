"""The experiment ledger ``sandbox/<model_key>_results.md`` (DESIGN.md, "Experiment ledger").

Parsing and formatting are pure; ``append`` and ``rewrite`` hold a file lock and replace the file
atomically (temp file + rename), so experiments on several GPUs of one host can append at once
without losing a row, and a reader never sees half a table. A malformed ledger is reported as
``path:line: LEDGER00x ...`` findings and never rewritten.

A value that was not measured (a crash, a CPU run without cuTile coverage) is written as
``n/a`` and read back as None, never as 0.00, so it cannot pass for a measured zero. Ledgers
written before that (``0.00`` for such rows) still read, as the zeros they say.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from tilegym.atomic import write_text_atomic
from tilegym.findings import Finding

HEADER = "| commit | cuTile coverage | cuTile throughput | status | description |"
SEPARATOR = "|:-------|----------------:|------------------:|:-------|:------------|"
LEDGER_STATUSES = ("keep", "discard", "timeout", "crash")
_COMMIT = re.compile(r"[0-9a-f]{8}")
_NUMBER = re.compile(r"\d+\.\d{2}")
NOT_MEASURED = "n/a"
_CELL_SPLIT = re.compile(r"(?<!\\)\|")


@dataclass(frozen=True)
class LedgerRow:
    commit: str  # 8 hex digits (longer SHAs are cut)
    coverage: float | None  # None: not measured
    throughput: float | None  # None: not measured
    status: str
    description: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "commit", self.commit[:8])
        object.__setattr__(self, "coverage", measured(self.coverage))
        object.__setattr__(self, "throughput", measured(self.throughput))
        if not _COMMIT.fullmatch(self.commit):
            raise ValueError(f"commit must be hex, got {self.commit!r}")
        if self.status not in LEDGER_STATUSES:
            raise ValueError(f"status must be one of {LEDGER_STATUSES}, got {self.status!r}")
        if not self.description.strip():
            raise ValueError("description must not be empty")

    def format(self) -> str:
        desc = " ".join(self.description.split()).replace("|", "\\|")
        return (
            f"| {self.commit} | {_number(self.coverage)} | {_number(self.throughput)} "
            f"| {self.status} | {desc} |"
        )


class LedgerError(Exception):
    """The existing ledger is malformed; ``findings`` say where."""

    def __init__(self, findings: list[Finding]):
        super().__init__("\n".join(str(f) for f in findings))
        self.findings = findings


def measured(value: object) -> float | None:
    """``value`` as a float, or None when it stands for "not measured" (None, ``n/a``, NaN,
    infinity): the one normal form of a ledger number."""
    if value is None or value == NOT_MEASURED:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"a ledger number must be a number or {NOT_MEASURED!r}, got {value!r}")
    return float(value) if math.isfinite(value) else None


def _number(value: float | None) -> str:
    """Two decimals, or ``n/a`` for a value that was not measured."""
    if value is None:
        return NOT_MEASURED
    return f"{max(value, 0.0):.2f}"


def ledger_path(repo_root: Path, model_key: str) -> Path:
    return Path(repo_root) / "sandbox" / f"{model_key}_results.md"


def parse(text: str, path: str) -> tuple[list[LedgerRow], list[Finding]]:
    """Rows of a ledger text and the findings that make it malformed (an empty text is valid)."""
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        return [], []
    findings: list[Finding] = []
    for number, expected in ((1, HEADER), (2, SEPARATOR)):
        got = lines[number - 1].strip() if len(lines) >= number else ""
        if got != expected:
            findings.append(
                Finding(
                    path, number, "LEDGER001", f"expected the table line {expected!r}, got {got!r}"
                )
            )
    rows: list[LedgerRow] = []
    for number, line in enumerate(lines[2:], start=3):
        row, problem = _parse_row(line)
        if problem:
            findings.append(Finding(path, number, problem[0], problem[1]))
        elif row:
            rows.append(row)
    return rows, findings


def _parse_row(line: str) -> tuple[LedgerRow | None, tuple[str, str] | None]:
    stripped = line.strip()
    if not (stripped.startswith("|") and stripped.endswith("|") and len(stripped) > 1):
        return None, ("LEDGER002", f"not a table row: {line!r}")
    cells = [c.strip() for c in _CELL_SPLIT.split(stripped[1:-1])]
    if len(cells) != 5:
        return None, ("LEDGER002", f"a row needs 5 cells, got {len(cells)}: {line!r}")
    commit, coverage, throughput, status, description = cells
    if not _COMMIT.fullmatch(commit):
        return None, ("LEDGER003", f"commit must be 8 lowercase hex digits, got {commit!r}")
    for name, cell in (("coverage", coverage), ("throughput", throughput)):
        if not (cell == NOT_MEASURED or _NUMBER.fullmatch(cell)):
            return None, (
                "LEDGER004",
                f"{name} must be a number with two decimals or {NOT_MEASURED}, got {cell!r}",
            )
    if status not in LEDGER_STATUSES:
        return None, (
            "LEDGER005",
            f"status must be one of {', '.join(LEDGER_STATUSES)}, got {status!r}",
        )
    if not description:
        return None, ("LEDGER006", "description is empty")
    description = description.replace("\\|", "|")
    values = [None if c == NOT_MEASURED else float(c) for c in (coverage, throughput)]
    return LedgerRow(commit, *values, status, description), None


def render(rows: Iterable[LedgerRow]) -> str:
    return "\n".join([HEADER, SEPARATOR, *(r.format() for r in rows)]) + "\n"


def _lock(path: Path) -> FileLock:
    return FileLock(str(path) + ".lock", timeout=60)


def read(path: Path) -> list[LedgerRow]:
    """The rows of the ledger at ``path`` (none when missing); LedgerError when malformed."""
    path = Path(path)
    if not path.exists():
        return []
    rows, findings = parse(path.read_text(encoding="utf-8"), str(path))
    if findings:
        raise LedgerError(findings)
    return rows


def append(path: Path, row: LedgerRow, *, skip_if_commit_present: bool = False) -> bool:
    """Append ``row`` under the lock; False (nothing written) when the commit already has a row
    and ``skip_if_commit_present`` is set. The header is written when the file is missing/empty."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock(path):
        rows = read(path)
        if skip_if_commit_present and any(r.commit == row.commit for r in rows):
            return False
        existing = path.read_text(encoding="utf-8") if path.exists() else ""
        if rows or existing.strip():
            text = existing.rstrip("\n") + "\n" + row.format() + "\n"
        else:
            text = render([row])
        write_text_atomic(path, text)
        return True


def rewrite(path: Path, rows: Iterable[LedgerRow]) -> None:
    """Replace the whole ledger (``ledger rebuild``), atomically and under the lock."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock(path):
        write_text_atomic(path, render(rows))
