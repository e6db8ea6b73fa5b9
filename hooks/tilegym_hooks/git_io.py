"""Git side of the guards (GitPython): open the repository, branch name, changes, the index."""

from __future__ import annotations

import os
from pathlib import Path

import git
from gitdb.exc import BadName, BadObject

from tilegym_hooks.paths import MAX_PARSED_BYTES
from tilegym_hooks.scope_rules import Change


class GitError(Exception):
    """A repository state the guard cannot work with; its text is the ``error:`` line."""


class MissingBase(GitError):
    """The base ref does not exist in this clone (e.g. a shallow CI checkout)."""


def open_repo(path: Path) -> git.Repo:
    try:
        return git.Repo(path, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise GitError(f"{path.resolve()} is not inside a git repository") from None


def work_tree_root(path: Path) -> Path:
    """The work tree around ``path``; ``path`` itself when it is not inside a git repository."""
    try:
        repo = git.Repo(path, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return path
    try:
        return Path(repo.working_tree_dir or path)
    finally:
        repo.close()


def indexed_paths(repo: git.Repo) -> list[str]:
    """Paths in the index: what the next commit holds (staged and unchanged tracked files)."""
    return sorted({path for path, _stage in repo.index.entries})


def current_branch(repo: git.Repo) -> str | None:
    """The checked-out branch; on a detached HEAD, GitHub's ``GITHUB_HEAD_REF`` if set."""
    if repo.head.is_detached:
        return os.environ.get("GITHUB_HEAD_REF") or None
    return repo.active_branch.name


def _blob_bytes(blob) -> bytes | None:
    """A blob's content, read up to one byte past the parse limit (rules see "too large")."""
    if blob is None:
        return None
    try:
        return blob.data_stream.read(MAX_PARSED_BYTES + 1)
    except (ValueError, BadObject, BadName, AttributeError):
        return b""  # a submodule entry has no readable blob: still a change of that path


def _changes_of(diff: git.Diff) -> list[Change]:
    base, head = _blob_bytes(diff.a_blob), _blob_bytes(diff.b_blob)
    old, new = diff.a_path, diff.b_path
    if diff.new_file:
        return [Change(new, None, head)]
    if diff.deleted_file:
        return [Change(old, base, None)]
    if old != new:
        return [Change(old, base, None), Change(new, None, head)]
    return [Change(new, base, head)]


def _resolve(repo: git.Repo, ref: str) -> git.Commit:
    try:
        return repo.commit(ref)
    except (BadName, BadObject, ValueError, git.GitCommandError):
        raise MissingBase(f"base ref {ref!r} does not exist in this repository") from None


def changes_since(repo: git.Repo, base_ref: str, *, against_index: bool) -> list[Change]:
    """Changes from the merge base of ``base_ref`` and HEAD to HEAD (or to the index)."""
    try:
        head = repo.head.commit
    except ValueError:
        raise GitError("HEAD has no commit yet") from None
    return changes_between(repo, base_ref, head, against_index=against_index)


def changes_between(
    repo: git.Repo, base_ref: str, head: git.Commit | str, *, against_index: bool = False
) -> list[Change]:
    """Changes from the merge base of ``base_ref`` and ``head`` to ``head`` (or to the index):
    what the experiment itself changed, whatever main did since it was cut."""
    base = _resolve(repo, base_ref)
    if isinstance(head, str):
        try:
            head = repo.commit(head)
        except (BadName, BadObject, ValueError, git.GitCommandError):
            raise GitError(f"commit {head!r} does not exist in this repository") from None
    merge_bases = repo.merge_base(base, head)
    if not merge_bases:
        raise GitError(f"{base_ref!r} and {head.hexsha[:8]} have no common ancestor")
    target = git.INDEX if against_index else head
    changes: list[Change] = []
    for diff in merge_bases[0].diff(target):
        changes.extend(_changes_of(diff))
    return changes
