"""A small JSON key/value cache on disk, safe for concurrent runs.

Readers and writers take a file lock; writes go to a temporary file renamed over the cache,
so a crash never leaves a half-written cache. A corrupt cache reads as empty.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from tilegym.atomic import write_json_atomic

LOCK_TIMEOUT_S = 30.0


def cache_dir() -> Path:
    """``$TILEGYM_CACHE_DIR`` when set, else ``~/.cache/tilegym``."""
    configured = os.environ.get("TILEGYM_CACHE_DIR")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "tilegym"


class JsonCache:
    """Entries of one JSON object file; ``get`` and ``put`` each hold the lock briefly."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = FileLock(str(self.path) + ".lock", timeout=LOCK_TIMEOUT_S)

    def get(self, key: str) -> Any | None:
        try:
            with self._lock:
                return self._read().get(key)
        except (OSError, Timeout):
            return None

    def keys(self) -> set[str]:
        """Every key stored now, read in one go (empty when the cache cannot be read)."""
        try:
            with self._lock:
                return set(self._read())
        except (OSError, Timeout):
            return set()

    def put(self, key: str, value: Any) -> bool:
        """Store ``value``; False (never an exception) when the cache cannot be written."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._lock:
                entries = self._read()
                entries[key] = value
                self._write(entries)
            return True
        except (OSError, Timeout, TypeError, ValueError):
            return False

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text("utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self, entries: dict[str, Any]) -> None:
        write_json_atomic(self.path, entries, indent=1, sort_keys=True)
