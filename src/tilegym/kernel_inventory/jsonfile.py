"""Read one inventory JSON file safely and remember the line of every key.

Any bad file (missing, unreadable, huge, binary, malformed, duplicate keys) becomes one
``Finding``; nothing here raises. The key-line index lets every later check point at the line
of the offending key instead of line 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tilegym.findings import Finding
from tilegym.kernel_inventory import codes

MAX_BYTES = 1_000_000
"""Inventory files are small hand-written JSON; anything bigger is a mistake, not data."""

JsonPath = tuple[str | int, ...]


@dataclass
class JsonFile:
    """A parsed JSON document plus the 1-based line where each path (key or item) starts."""

    path: str
    data: Any
    lines: dict[JsonPath, int] = field(default_factory=dict)

    def line_of(self, json_path: JsonPath) -> int:
        """Line of the deepest known prefix of ``json_path`` (1 when nothing matches)."""
        json_path = tuple(json_path)
        while json_path:
            if json_path in self.lines:
                return self.lines[json_path]
            json_path = json_path[:-1]
        return 1


def finding(path: str, line: int, code: str, message: str) -> Finding:
    """A ``Finding`` whose message is guaranteed to be one printable line."""
    flat = " ".join(str(message).split())
    if len(flat) > 600:
        flat = flat[:597] + "..."
    return Finding(str(path), max(int(line), 1), code, flat or "(no message)")


def load_json_file(path: Path, shown: str | None = None) -> JsonFile | Finding:
    """Load ``path``; return the parsed file or the single finding that explains why not."""
    shown = shown if shown is not None else str(path)
    try:
        if not path.is_file():
            what = "does not exist" if not path.exists() else "is not a regular file"
            return finding(shown, 1, codes.FILE_UNREADABLE, f"file {what}")
        size = path.stat().st_size
        if size > MAX_BYTES:
            return finding(
                shown, 1, codes.FILE_TOO_LARGE, f"file is {size} bytes, over the {MAX_BYTES} cap"
            )
        raw = path.read_bytes()
    except OSError as exc:
        return finding(shown, 1, codes.FILE_UNREADABLE, f"cannot read file: {exc.strerror or exc}")
    return parse_json_text(raw, shown)


def parse_json_text(raw: bytes, shown: str) -> JsonFile | Finding:
    """Parse bytes already read from ``shown``; same contract as ``load_json_file``."""
    if len(raw) > MAX_BYTES:
        return finding(
            shown, 1, codes.FILE_TOO_LARGE, f"file is {len(raw)} bytes, over the {MAX_BYTES} cap"
        )
    if b"\x00" in raw:
        line = raw[: raw.index(b"\x00")].count(b"\n") + 1
        return finding(shown, line, codes.FILE_BINARY, "file holds NUL bytes: binary, not JSON")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        return finding(shown, line, codes.FILE_BINARY, f"file is not UTF-8 text ({exc.reason})")
    if text.startswith("\ufeff"):
        text = text[1:]
    duplicates: list[str] = []

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                duplicates.append(key)
            seen[key] = value
        return seen

    try:
        data = json.loads(text, object_pairs_hook=no_duplicates, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        return finding(shown, exc.lineno, codes.JSON_MALFORMED, _decode_message(exc, text))
    except ValueError as exc:
        return finding(shown, 1, codes.JSON_MALFORMED, f"malformed JSON: {exc}")
    except RecursionError:
        return finding(shown, 1, codes.JSON_MALFORMED, "malformed JSON: nested too deeply")
    try:
        lines = _index_lines(text)
    except (RecursionError, ValueError):
        lines = {}
    if duplicates:
        key = duplicates[0]
        line = next((ln for p, ln in lines.items() if p and p[-1] == key), 1)
        return finding(shown, line, codes.JSON_DUPLICATE_KEY, f"duplicate key {key!r}")
    return JsonFile(shown, data, lines)


def _decode_message(exc: json.JSONDecodeError, text: str) -> str:
    """The decoder's message with its column (the line is the finding's), and whether the
    text stopped there, which is what a truncated file looks like."""
    ended = " (the file ends there: truncated?)" if not text[exc.pos :].strip() else ""
    return f"malformed JSON at column {exc.colno}: {exc.msg}{ended}"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder()
_WS = " \t\n\r"


def _index_lines(text: str) -> dict[JsonPath, int]:
    """Map every key path and array item path of a valid JSON text to its starting line."""
    lines: dict[JsonPath, int] = {}
    newlines = _newline_offsets(text)

    def line_at(pos: int) -> int:
        lo, hi = 0, len(newlines)
        while lo < hi:
            mid = (lo + hi) // 2
            if newlines[mid] < pos:
                lo = mid + 1
            else:
                hi = mid
        return lo + 1

    def skip(pos: int) -> int:
        while pos < len(text) and text[pos] in _WS:
            pos += 1
        return pos

    def value(pos: int, json_path: JsonPath) -> int:
        pos = skip(pos)
        char = text[pos]
        if char == "{":
            pos = skip(pos + 1)
            if text[pos] == "}":
                return pos + 1
            while True:
                pos = skip(pos)
                key_start = pos
                key, pos = json.decoder.scanstring(text, pos + 1)
                lines.setdefault((*json_path, key), line_at(key_start))
                pos = skip(pos)
                pos = value(pos + 1, (*json_path, key))  # past ':'
                pos = skip(pos)
                if text[pos] == "}":
                    return pos + 1
                pos += 1  # ','
        if char == "[":
            pos = skip(pos + 1)
            if text[pos] == "]":
                return pos + 1
            index = 0
            while True:
                pos = skip(pos)
                lines.setdefault((*json_path, index), line_at(pos))
                pos = value(pos, (*json_path, index))
                pos = skip(pos)
                if text[pos] == "]":
                    return pos + 1
                pos += 1
                index += 1
        _, end = _DECODER.raw_decode(text, pos)
        return end

    value(0, ())
    return lines


def _newline_offsets(text: str) -> list[int]:
    offsets = []
    start = text.find("\n")
    while start != -1:
        offsets.append(start)
        start = text.find("\n", start + 1)
    return offsets
