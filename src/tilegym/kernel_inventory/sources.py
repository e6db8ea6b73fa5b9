"""Verify that each ``# Source:`` permalink cites real, non-blank code.

The cited file is read at the pinned commit from a local clone (``OWNER/REPO=PATH`` given by
flag or ``TILEGYM_SOURCE_REPOS``, read with GitPython's ``git show``) or, without a clone,
over HTTPS from raw.githubusercontent.com / huggingface.co. Verified permalinks go into a
small on-disk cache: the commit is pinned, so a verified region never changes.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tilegym.kernel_inventory import codes
from tilegym.kernel_inventory.cache import JsonCache, cache_dir
from tilegym.kernel_inventory.permalink import Permalink

ENV_REPOS = "TILEGYM_SOURCE_REPOS"
ENV_GITHUB_RAW = "TILEGYM_GITHUB_RAW_BASE"
ENV_HF = "TILEGYM_HF_BASE"
DEFAULT_GITHUB_RAW = "https://raw.githubusercontent.com"
DEFAULT_HF = "https://huggingface.co"
HTTP_TIMEOUT_S = 20.0
MAX_FETCH_BYTES = 20_000_000


class CiteError(Exception):
    """A cited region cannot be confirmed; ``code`` is the finding code."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def parse_repo_specs(specs: Iterable[str]) -> dict[str, Path]:
    """``["OWNER/REPO=PATH", ...]`` -> ``{"owner/repo": Path}``; ValueError on a bad entry."""
    repos: dict[str, Path] = {}
    for spec in specs:
        spec = spec.strip()
        if not spec:
            continue
        name, sep, path = spec.partition("=")
        name = name.strip()
        if not sep or not path.strip() or name.count("/") != 1 or "" in name.split("/"):
            raise ValueError(f"source repo must look like OWNER/REPO=PATH, got {spec!r}")
        repos[name.lower()] = Path(path.strip()).expanduser()
    return repos


def repos_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Path]:
    """Clones named in ``TILEGYM_SOURCE_REPOS`` (``OWNER/REPO=PATH`` separated by ``;``)."""
    environ = os.environ if environ is None else environ
    return parse_repo_specs(environ.get(ENV_REPOS, "").split(";"))


@dataclass
class SourceVerifier:
    """Reads cited files from clones or HTTPS and checks the cited line range."""

    clones: dict[str, Path]
    cache: JsonCache | None = None
    github_raw_base: str = DEFAULT_GITHUB_RAW
    hf_base: str = DEFAULT_HF
    timeout_s: float = HTTP_TIMEOUT_S

    @classmethod
    def from_environment(
        cls, flag_specs: Iterable[str] = (), *, use_cache: bool = True
    ) -> SourceVerifier:
        """Clones from env then flags (flags win), cache and URL bases from the environment."""
        clones = repos_from_env()
        clones.update(parse_repo_specs(flag_specs))
        return cls(
            clones=clones,
            cache=JsonCache(cache_dir() / "permalinks.json") if use_cache else None,
            github_raw_base=os.environ.get(ENV_GITHUB_RAW, DEFAULT_GITHUB_RAW).rstrip("/"),
            hf_base=os.environ.get(ENV_HF, DEFAULT_HF).rstrip("/"),
        )

    def verify(self, link: Permalink) -> None:
        """Return when the cited region exists and is not blank; raise ``CiteError`` otherwise."""
        if self.cache is not None and self.cache.get(link.url):
            return
        text = self.read_file(link)
        lines = text.splitlines()
        if link.last > len(lines):
            raise CiteError(
                codes.CITE_BAD_RANGE,
                f"{_cite(link)}: the file has only {len(lines)} lines",
            )
        if not any(line.strip() for line in lines[link.first - 1 : link.last]):
            raise CiteError(codes.CITE_BLANK, f"{_cite(link)}: the cited lines are blank")
        if self.cache is not None:
            self.cache.put(link.url, {"file_lines": len(lines)})

    def read_file(self, link: Permalink) -> str:
        clone = self.clones.get(link.repo_id.lower())
        if clone is not None:
            return _read_from_clone(clone, link)
        return self._read_over_https(link)

    def _read_over_https(self, link: Permalink) -> str:
        if link.host == "github":
            url = f"{self.github_raw_base}/{link.repo_id}/{link.commit}/{link.path}"
        else:
            url = f"{self.hf_base}/{link.repo_id}/raw/{link.commit}/{link.path}"
        request = urllib.request.Request(url, headers={"User-Agent": "tilegym-inventory"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                data = response.read(MAX_FETCH_BYTES + 1)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise CiteError(
                    codes.CITE_NO_FILE,
                    f"{_cite(link)}: file or commit not found (HTTP 404 from {_host(url)})",
                ) from None
            raise CiteError(
                codes.CITE_UNREACHABLE, f"{_cite(link)}: HTTP {exc.code} from {_host(url)}"
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CiteError(
                codes.CITE_UNREACHABLE,
                f"{_cite(link)}: cannot fetch from {_host(url)} ({reason}); give a clone with "
                f"--source-repo {link.repo_id}=PATH or {ENV_REPOS}",
            ) from None
        if len(data) > MAX_FETCH_BYTES:
            raise CiteError(
                codes.CITE_UNREACHABLE, f"{_cite(link)}: cited file is over {MAX_FETCH_BYTES} bytes"
            )
        return data.decode("utf-8", errors="replace")


def _cite(link: Permalink) -> str:
    """Short, unambiguous name of a cited region for messages."""
    return f"{link.repo_id}@{link.commit[:12]}:{link.path}#L{link.first}-L{link.last}"


def _host(url: str) -> str:
    return urllib.parse.urlsplit(url).netloc or url


def _read_from_clone(clone: Path, link: Permalink) -> str:
    import git  # GitPython; imported here so plain checks never need a git binary

    try:
        repo = git.Repo(clone)
    except (git.exc.InvalidGitRepositoryError, git.exc.NoSuchPathError, OSError) as exc:
        raise CiteError(
            codes.CITE_UNREACHABLE,
            f"{_cite(link)}: {clone} is not a git clone of {link.repo_id} ({exc})",
        ) from None
    try:
        with repo:
            try:
                repo.git.cat_file("-e", f"{link.commit}^{{commit}}")
            except git.exc.GitCommandNotFound:
                raise CiteError(
                    codes.CITE_UNREACHABLE, f"{_cite(link)}: the git program is not installed"
                ) from None
            except git.exc.GitCommandError:
                raise CiteError(
                    codes.CITE_NO_COMMIT,
                    f"{_cite(link)}: commit {link.commit} does not exist in the clone at {clone}",
                ) from None
            try:
                return repo.git.show(f"{link.commit}:{link.path}")
            except git.exc.GitCommandError:
                raise CiteError(
                    codes.CITE_NO_FILE,
                    f"{_cite(link)}: {link.path} does not exist at commit {link.commit[:12]}",
                ) from None
    except git.exc.GitError as exc:
        raise CiteError(codes.CITE_UNREACHABLE, f"{_cite(link)}: git failed: {exc}") from None
