"""Read a metrics file. Unreadable or non-JSON is a usage error; schema problems are left to
the policy, which turns them into an ``inconclusive`` verdict with the schema's reasons."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tilegym_bot.errors import BotError


def load_metrics(path: Path | str) -> Any:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BotError(f"{path}: cannot read metrics file: {exc}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BotError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from exc
