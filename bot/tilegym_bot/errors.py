"""The one exception type whose message is shown to the user as ``error: <message>``."""

from __future__ import annotations


class BotError(Exception):
    """Bad input or a refused action; the CLI prints ``details`` lines (findings, if any) and
    then ``error: <message>``, and exits non-zero."""

    def __init__(self, message: str, details: list[str] | None = None):
        super().__init__(message)
        self.details = details or []
