"""Regenerate ledger rows from the records the bot embedded in its PR comments.

A record's unmeasured coverage or throughput (null) becomes ``n/a`` in the ledger, as in a row
appended by the loop itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tilegym_bot.errors import BotError
from tilegym_bot.forge.local import LocalForge
from tilegym_bot.ledger import LedgerRow
from tilegym_bot.report import parse_record


def local_records(forge: LocalForge) -> list[dict[str, Any]]:
    """The embedded records of the local PR comments."""
    found = []
    for pr in forge.pr_records():
        record = parse_record(pr.get("comment") or "")
        if record:
            found.append(record)
    return found


def rows_from_records(records: Iterable[dict[str, Any]], model_key: str) -> list[LedgerRow]:
    """One row per final decision of ``model_key`` (plus its baseline row), oldest first; a commit
    already in the table is not repeated (the same PR decided twice counts once)."""
    chosen = sorted(
        (r for r in records if r.get("model_key") == model_key and r.get("final", True)),
        key=lambda r: (str(r.get("decided_at")), r.get("pr") or 0),
    )
    rows: list[LedgerRow] = []
    seen: set[str] = set()
    for record in chosen:
        try:
            candidates = _rows_of(record)
        except (KeyError, TypeError, ValueError) as exc:
            where = f"PR #{record.get('pr')}" if record.get("pr") else "a PR record"
            raise BotError(f"{where}: its embedded record is not a ledger row ({exc})") from exc
        for row in candidates:
            if row.commit not in seen:
                seen.add(row.commit)
                rows.append(row)
    return rows


def _rows_of(record: dict[str, Any]) -> list[LedgerRow]:
    """The baseline row (first run of a model) and the decision's row of one record."""
    rows = [LedgerRow(**record["baseline_row"])] if record.get("baseline_row") else []
    rows.append(
        LedgerRow(
            record["head_sha"],
            record.get("coverage"),
            record.get("throughput"),
            record["ledger_status"],
            record["description"],
        )
    )
    return rows
