"""Write a file so that readers see the old content or the new one, never half of either.

Every tool here (ledger, PR records, metrics, caches) writes through these two functions: a
temp file in the target's directory, flushed and fsynced, then renamed over the target.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(
    path: str | os.PathLike,
    doc: Any,
    *,
    indent: int = 2,
    sort_keys: bool = False,
    allow_nan: bool = True,
) -> None:
    """Serialize first (a value JSON cannot hold fails before any file is touched), then write."""
    text = json.dumps(doc, indent=indent, sort_keys=sort_keys, allow_nan=allow_nan) + "\n"
    write_text_atomic(path, text)
