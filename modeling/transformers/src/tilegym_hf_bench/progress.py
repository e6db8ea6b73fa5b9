"""The worker's running record, rewritten atomically after every phase so the supervisor finds
what was known even when it has to kill the worker."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tilegym_hf_bench.metrics import write_atomic


class Progress:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.data: dict[str, Any] = {
            "status": "running",
            "parts": {},
            "not_measured": {},
            "phases_s": {},
        }
        write_atomic(self.path, self.data)

    def update(self, **fields: Any) -> None:
        self.data.update(fields)
        write_atomic(self.path, self.data)

    def part(self, name: str, block: Any) -> None:
        self.data["parts"][name] = block
        write_atomic(self.path, self.data)

    @contextmanager
    def phase(self, name: str):
        """Wall seconds of one phase of the run (model build, worker start, warm-up, timing,
        profile, correctness), kept in the metrics so a slower judge shows where it spends."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add_phase(name, time.perf_counter() - start)

    def add_phase(self, name: str, seconds: float) -> None:
        """``seconds`` more of phase ``name`` (one that may overlap others: the worker's start
        runs while this process compiles its own side)."""
        phases = self.data["phases_s"]
        phases[name] = round(phases.get(name, 0.0) + seconds, 3)
        write_atomic(self.path, self.data)

    def not_measured(self, name: str, reason: str) -> None:
        self.data["parts"][name] = None
        self.data["not_measured"][name] = reason
        write_atomic(self.path, self.data)


def read_progress(path: str | Path) -> dict[str, Any] | None:
    """The last record the worker wrote, or None when there is none (or it is unreadable)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
