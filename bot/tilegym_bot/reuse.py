"""Reuse of an earlier benchmark of main's code, so an experiment benchmarks only its head.

After a discard, main has not moved; after a keep, main is a merge commit whose tree is the head
just measured. Either way the code of main was usually benchmarked already, under another commit
name. A stored run is reused only when it measured the same tree under the same conditions as
the head about to be compared with it; the decision's paired speedup ratio (DESIGN.md, Decision)
cancels the machine drift between the two jobs.

``match_reason`` is pure (plain dicts); ``find_reusable`` reads ``sandbox/runs/*/metrics.json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

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


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def find_reusable(
    runs_dir: Path,
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
    for path in sorted(runs_dir.glob("*/metrics.json")):
        if path.resolve() in skip:
            continue
        doc = _load(path)
        commit = dig(doc, "commit")
        if not isinstance(commit, str) or tree_of(commit) != tree:
            continue
        if match_reason(doc, head) is not None:
            continue
        started = str(dig(doc, "started_at") or "")
        if best is None or started > best[0]:
            best = (started, path, doc)
    return None if best is None else (best[1], best[2])
