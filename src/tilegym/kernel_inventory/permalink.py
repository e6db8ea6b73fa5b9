"""Parse ``# Source:`` permalinks: pure string logic, no I/O.

A precise permalink pins a commit and a line range, so the cited code cannot drift:

* ``https://github.com/<owner>/<repo>/blob/<40 lowercase hex>/<path>#L<a>[-L<b>]``
* ``https://huggingface.co/<org>/<model>/blob/<40 lowercase hex>/<file>#L<a>[-L<b>]``

with ``1 <= a <= b``. Branch names, tags and short SHAs are rejected because the code they
point to changes over time. Shared by the inventory checks and the pre-commit hooks.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

HOSTS = {"github.com": "github", "huggingface.co": "huggingface"}

_SOURCE_LINE = re.compile(r"^\s*#\s*Source:(?P<rest>.*)$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SHA = re.compile(r"^[0-9a-f]{40}$")
_ANCHOR = re.compile(r"^L(?P<a>[0-9]+)(?:-L(?P<b>[0-9]+))?$")


@dataclass(frozen=True)
class Permalink:
    """One precise permalink: which file at which commit, lines ``first..last`` (1-based)."""

    host: str  # "github" or "huggingface"
    owner: str
    repo: str
    commit: str
    path: str
    first: int
    last: int

    @property
    def repo_id(self) -> str:
        return f"{self.owner}/{self.repo}"

    @property
    def url(self) -> str:
        domain = "github.com" if self.host == "github" else "huggingface.co"
        anchor = f"L{self.first}" if self.first == self.last else f"L{self.first}-L{self.last}"
        return f"https://{domain}/{self.repo_id}/blob/{self.commit}/{self.path}#{anchor}"


@dataclass(frozen=True)
class PermalinkError:
    """Why a string is not a precise permalink (one sentence, no trailing period)."""

    message: str


@dataclass(frozen=True)
class SourceLine:
    """A ``# Source:`` comment found in a reference: its 1-based line and the text after it."""

    lineno: int
    url: str


def iter_source_lines(reference_text: str) -> Iterator[SourceLine]:
    """Yield every ``# Source:`` comment line of ``reference_text``, wherever it appears."""
    for lineno, line in enumerate(reference_text.splitlines(), start=1):
        match = _SOURCE_LINE.match(line)
        if match:
            yield SourceLine(lineno, match.group("rest").strip())


def leading_source_lines(reference_text: str) -> list[SourceLine]:
    """The unbroken run of ``# Source:`` lines that opens the reference (empty if none)."""
    found: list[SourceLine] = []
    for lineno, line in enumerate(reference_text.splitlines(), start=1):
        match = _SOURCE_LINE.match(line)
        if not match:
            break
        found.append(SourceLine(lineno, match.group("rest").strip()))
    return found


def parse_permalink(url: object) -> Permalink | PermalinkError:
    """Return the parsed permalink, or a ``PermalinkError`` saying what is wrong; never raises."""
    if not isinstance(url, str):
        return PermalinkError(f"permalink must be a string, got {type(url).__name__}")
    shown = _shorten(url)
    if not url:
        return PermalinkError("empty permalink")
    if any(ch.isspace() for ch in url):
        return PermalinkError(f"permalink contains whitespace: {shown}")
    if not url.startswith("https://"):
        return PermalinkError(f"permalink must start with https://: {shown}")
    rest = url[len("https://") :]
    domain, _, rest = rest.partition("/")
    host = HOSTS.get(domain)
    if host is None:
        return PermalinkError(
            f"permalink host must be github.com or huggingface.co, got {_shorten(domain)!r}"
        )
    if "?" in rest:
        return PermalinkError(f"permalink must not carry a query string: {shown}")
    body, hash_sign, anchor = rest.partition("#")
    parts = body.split("/")
    if len(parts) < 5:
        return PermalinkError(f"permalink needs <owner>/<repo>/blob/<commit>/<path>: {shown}")
    owner, repo, kind, commit, *path_parts = parts
    for label, value in (("owner", owner), ("repository", repo)):
        if not _NAME.match(value):
            return PermalinkError(f"permalink {label} is missing or invalid: {shown}")
    if kind != "blob":
        return PermalinkError(f"permalink must be a /blob/ link, got /{_shorten(kind)}/: {shown}")
    if not _SHA.match(commit):
        return PermalinkError(
            f"permalink commit must be 40 lowercase hex digits, got {_shorten(commit)!r} "
            "(branch names, tags and short SHAs drift)"
        )
    if not path_parts or any(part in ("", ".", "..") for part in path_parts):
        return PermalinkError(f"permalink file path is missing or not normalized: {shown}")
    if not hash_sign:
        return PermalinkError(f"permalink needs a line anchor #L<a> or #L<a>-L<b>: {shown}")
    match = _ANCHOR.match(anchor)
    if not match:
        return PermalinkError(
            f"permalink line anchor must be #L<a> or #L<a>-L<b>, got #{_shorten(anchor)}"
        )
    first = int(match.group("a"))
    last = int(match.group("b")) if match.group("b") is not None else first
    if first < 1:
        return PermalinkError("permalink line numbers start at 1")
    if last < first:
        return PermalinkError(f"permalink line range is reversed: L{first}-L{last}")
    return Permalink(host, owner, repo, commit, "/".join(path_parts), first, last)


def _shorten(text: str, limit: int = 120) -> str:
    """Keep a message on one readable line whatever the input holds."""
    flat = text.encode("unicode_escape").decode("ascii")
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
