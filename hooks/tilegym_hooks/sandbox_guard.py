"""Sandbox guard: only ``sandbox/README.md`` and ``sandbox/.gitignore`` may be committed.

Experiment scratch files and ledgers live under ``sandbox/`` on each machine and never reach
the repository; the check runs on the git index, which is exactly what the next commit holds.
"""

from __future__ import annotations

from collections.abc import Iterable

from tilegym.findings import Finding
from tilegym_hooks.paths import SANDBOX_DIR, SANDBOX_KEPT


def sandbox_findings(indexed_paths: Iterable[str]) -> list[Finding]:
    """One SANDBOX001 finding per indexed path under ``sandbox/`` other than the kept two."""
    return [
        Finding(path, 1, "SANDBOX001", f"{SANDBOX_DIR}/ holds only scratch files: unstage it")
        for path in indexed_paths
        if path.startswith(f"{SANDBOX_DIR}/") and path not in SANDBOX_KEPT
    ]
