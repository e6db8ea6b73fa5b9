"""Reuse of an earlier benchmark of main's code, so an experiment benchmarks only its head.

After a discard, main has not moved; after a keep, main is a merge commit whose tree is the head
just measured. Either way the code of main was usually benchmarked already, under another commit
name. A stored run is reused only when it measured the same tree under the same conditions as
the head about to be compared with it; the decision's paired speedup ratio (DESIGN.md, Decision)
cancels the machine drift between the two jobs.

A stored run counts only if the bot recorded it: ``RunIndex`` keeps, in bot-owned storage
outside the work tree (``.git/tilegym-bot/runs.json``), the SHA-256 of every metrics file the
loop itself produced, and a file under ``sandbox/runs/`` that is not in the index with that
hash (written or edited by anything else, the benchmarked code included) is never reused.

``match_reason`` is pure (plain dicts); ``find_reusable`` reads the indexed metrics files.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock

from tilegym.atomic import write_json_atomic
from tilegym_bot.policy import differences, dig

SAME_FIELDS = (
    ("model_id",),
    ("weights",),
    ("workload",),
    ("env", "gpu_name"),
    ("env", "driver"),
    ("env", "torch"),
    ("env", "transformers"),
    ("env", "cuda_tile"),
    ("env", "tileiras"),
)
"""Fields that must be equal beyond ``policy.differences`` (which the decision checks anyway)."""


def match_reason(candidate: Any, head: Any) -> str | None:
    """Why ``candidate`` cannot stand in for a fresh base run next to ``head`` (None: it can).

    Both are metrics documents. The tree comparison is the caller's: here only the measurement
    conditions (model, workload, GPU, software versions) and the candidate's health count.
    """
    if not isinstance(candidate, dict) or candidate.get("status") != "ok":
        return "not a successful run"
    if dig(candidate, "cutile", "throughput", "samples") is None:
        return "no cuTile throughput"
    if dig(candidate, "coverage", "gpu_time_pct") is None:
        return "no coverage"
    if dig(candidate, "correctness", "passed") is not True:
        return "correctness did not pass"
    found = differences(candidate, head)
    if found:
        return found[0]
    for keys in SAME_FIELDS:
        if dig(candidate, *keys) != dig(head, *keys):
            return f"{'.'.join(keys)} differs"
    return None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class RunIndex:
    """The metrics files the loop produced, by path relative to ``runs_dir``, with their hash."""

    def __init__(self, path: Path, runs_dir: Path):
        self.path = path
        self.runs_dir = runs_dir

    def _read(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def record(self, metrics: Path) -> None:
        """Index ``metrics`` as the loop's own, as it is now (call right after the run)."""
        try:
            digest = _sha256(metrics.read_bytes())
        except OSError:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock", timeout=60):
            entries = self._read()
            entries[metrics.resolve().relative_to(self.runs_dir.resolve()).as_posix()] = digest
            write_json_atomic(self.path, entries)

    def trusted_runs(self) -> Iterator[tuple[Path, Any]]:
        """(path, document) of every indexed run whose file still has the recorded hash."""
        for rel, digest in sorted(self._read().items()):
            path = self.runs_dir / rel
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if _sha256(data) != digest:
                continue
            try:
                yield path, json.loads(data)
            except ValueError:
                continue


def find_reusable(
    index: RunIndex,
    *,
    tree: str,
    head: Any,
    tree_of: Callable[[str], str | None],
    exclude: Iterable[Path] = (),
) -> tuple[Path, Any] | None:
    """The newest stored run (by ``started_at``) of code with tree ``tree`` that matches ``head``.

    ``tree_of`` maps a commit SHA to its tree SHA (None for a commit the repository lacks).
    """
    skip = {p.resolve() for p in exclude}
    best: tuple[str, Path, Any] | None = None
    for path, doc in index.trusted_runs():
        if path.parent.resolve() in skip or path.resolve() in skip:
            continue
        commit = dig(doc, "commit")
        if not isinstance(commit, str) or tree_of(commit) != tree:
            continue
        if match_reason(doc, head) is not None:
            continue
        started = str(dig(doc, "started_at") or "")
        if best is None or started > best[0]:
            best = (started, path, doc)
    return None if best is None else (best[1], best[2])
