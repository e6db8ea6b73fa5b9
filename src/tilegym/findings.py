"""One finding = one line ``path:line: CODE message``: the output format of every checker.

Shared by the inventory checks and the pre-commit hooks so that every tool reports bad input
the same way (DESIGN.md, "Every finding is one line").
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Finding:
    path: str
    line: int
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{max(self.line, 1)}: {self.code} {self.message}"


def report(findings: Iterable[Finding], stream=None) -> int:
    """Print findings sorted and de-duplicated; return the exit code (0 none, 1 some)."""
    stream = stream or sys.stdout
    unique = sorted(set(findings))
    for finding in unique:
        print(finding, file=stream)
    return 1 if unique else 0
