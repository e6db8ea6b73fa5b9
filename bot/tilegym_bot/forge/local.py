"""The local forge: experiment branches, merges, archive tags and PR records in plain git.

Everything goes through GitPython. A merge into ``main`` never touches the working tree: the
merged tree is computed with ``git merge-tree --write-tree`` (git ≥ 2.38), committed with
``commit-tree`` and published with a compare-and-swap ``update-ref``, so a concurrent change of
``main`` makes the merge fail instead of being overwritten. PR records (one JSON file per
experiment, like a pull request) live under ``.git/tilegym-bot/prs/``, out of the tree.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import git
from filelock import FileLock

from tilegym.atomic import write_json_atomic, write_text_atomic
from tilegym_bot.errors import BotError

MAIN = "main"


def now_iso() -> str:
    return (
        dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    )


class LocalForge:
    def __init__(self, path: Path | str = "."):
        try:
            self.repo = git.Repo(path, search_parent_directories=True)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
            raise BotError(f"{path}: not inside a git repository") from exc
        if self.repo.bare:
            raise BotError(f"{path}: a bare repository has no working tree")
        self.root = Path(self.repo.working_tree_dir)
        self.state_dir = Path(self.repo.git_dir) / "tilegym-bot"
        self.prs_dir = self.state_dir / "prs"

    # ---- git queries -------------------------------------------------------------------------
    def dirty_paths(self) -> list[str]:
        """Modified, staged or untracked (not ignored) paths; empty when the tree is clean."""
        out = self.repo.git.status("--porcelain", "--untracked-files=normal")
        return [line[3:] for line in out.splitlines() if line.strip()]

    def current_branch(self) -> str | None:
        return None if self.repo.head.is_detached else self.repo.active_branch.name

    def rev(self, ref: str) -> str:
        try:
            return self.repo.git.rev_parse("--verify", "--quiet", f"{ref}^{{commit}}")
        except git.GitCommandError as exc:
            raise BotError(f"no such commit or branch: {ref}") from exc

    def tree_of(self, sha: str) -> str | None:
        """The tree SHA of commit ``sha``; None when the repository has no such commit."""
        try:
            return self.repo.git.rev_parse("--verify", "--quiet", f"{sha}^{{tree}}")
        except git.GitCommandError:
            return None

    def has_ref(self, ref: str) -> bool:
        try:
            self.repo.git.rev_parse("--verify", "--quiet", ref)
        except git.GitCommandError:
            return False
        return True

    def tag_target(self, tag: str) -> str | None:
        return self.rev(f"refs/tags/{tag}") if self.has_ref(f"refs/tags/{tag}") else None

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        try:
            self.repo.git.merge_base("--is-ancestor", ancestor, descendant)
        except git.GitCommandError:
            return False
        return True

    def merge_conflicts(self, ours: str, theirs: str) -> tuple[str | None, list[str]]:
        """(merged tree, []) when ``theirs`` merges cleanly into ``ours``, else (None, files)."""
        status, out, err = self.repo.git.merge_tree(
            "--write-tree",
            "--name-only",
            "--no-messages",
            ours,
            theirs,
            with_extended_output=True,
            with_exceptions=False,
        )
        if status not in (0, 1):
            raise BotError(f"git merge-tree failed: {err.strip()}")
        tree, *files = [line.strip() for line in out.splitlines() if line.strip()]
        if status == 1:
            return None, sorted(set(files)) or ["(unknown files)"]
        return tree, []

    def changed_files(self, base: str, head: str) -> list[str]:
        """Paths added or modified on ``head`` since it forked from ``base``."""
        out = self.repo.git.diff("--name-only", "--diff-filter=AMR", f"{base}...{head}")
        return [p for p in out.splitlines() if p]

    def file_at(self, sha: str, path: str) -> bytes:
        return self.repo.git.show(f"{sha}:{path}", stdout_as_string=False)

    # ---- git changes -------------------------------------------------------------------------
    def create_branch(self, name: str, start: str) -> None:
        self.repo.git.checkout("-b", name, start)

    def checkout(self, ref: str) -> None:
        self.repo.git.checkout(ref)

    def delete_branch(self, name: str) -> None:
        self.repo.git.branch("-D", name)

    def tag(self, name: str, sha: str, message: str) -> None:
        self.repo.git.tag("-a", name, sha, "-m", message)

    def merge_into_main(self, head: str, message: str) -> str:
        """Merge commit of ``head`` into main, working tree untouched; returns the new main."""
        old = self.rev(MAIN)
        tree, conflicts = self.merge_conflicts(old, head)
        if tree is None:
            raise BotError(f"merge into {MAIN} would conflict in: {', '.join(conflicts)}")
        commit = self.repo.git.commit_tree(tree, "-p", old, "-p", head, "-m", message)
        try:
            self.repo.git.update_ref(f"refs/heads/{MAIN}", commit, old, "-m", message)
        except git.GitCommandError as exc:
            raise BotError(f"{MAIN} moved during the merge; nothing merged: {exc.stderr}") from exc
        return commit

    @contextlib.contextmanager
    def worktree(self, sha: str) -> Iterator[Path]:
        """A detached checkout of ``sha`` in a temporary directory, removed afterwards."""
        path = Path(tempfile.mkdtemp(prefix="tilegym-bot-wt-"))
        path.rmdir()
        self.repo.git.worktree("add", "--detach", str(path), sha)
        try:
            yield path
        finally:
            with contextlib.suppress(git.GitCommandError):
                self.repo.git.worktree("remove", "--force", str(path))
            shutil.rmtree(path, ignore_errors=True)
            self.repo.git.worktree("prune")

    # ---- PR records --------------------------------------------------------------------------
    def _lock(self) -> FileLock:
        self.prs_dir.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.state_dir / "prs.lock"), timeout=60)

    def pr_records(self) -> list[dict[str, Any]]:
        if not self.prs_dir.is_dir():
            return []
        records = []
        for path in sorted(self.prs_dir.glob("*.json"), key=lambda p: int(p.stem)):
            try:
                records.append(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, json.JSONDecodeError) as exc:
                raise BotError(f"{path}: unreadable PR record: {exc}") from exc
        return records

    def find_pr(self, branch: str) -> dict[str, Any] | None:
        """The newest record of ``branch`` (a branch name can be reused after ``advance``)."""
        found = [r for r in self.pr_records() if r["branch"] == branch and not r.get("retired")]
        return found[-1] if found else None

    def save_pr(self, record: dict[str, Any]) -> dict[str, Any]:
        """Write a record atomically; a record without a number gets the next free one."""
        with self._lock():
            if record.get("number") is None:
                numbers = [int(p.stem) for p in self.prs_dir.glob("*.json")]
                record["number"] = max(numbers, default=0) + 1
                record["created_at"] = now_iso()
            record["updated_at"] = now_iso()
            path = self.prs_dir / f"{record['number']}.json"
            write_json_atomic(path, record, sort_keys=True)
        return record

    def write_report(self, number: int, text: str) -> Path:
        self.prs_dir.mkdir(parents=True, exist_ok=True)
        path = self.prs_dir / f"{number}.md"
        write_text_atomic(path, text)
        return path
