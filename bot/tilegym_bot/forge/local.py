"""The local forge: experiment branches, merges, archive tags and PR records in plain git.

Everything goes through GitPython. A merge into ``main`` never touches the working tree: the
merged tree is computed with ``git merge-tree --write-tree`` (git ≥ 2.38), committed with
``commit-tree`` and published with a compare-and-swap ``update-ref`` against the ``main`` that
was measured, so a keep lands only on the tree that was benchmarked (``MainMoved`` otherwise).

One repository has one bot state whatever worktree runs the bot: PR records, their numbering
and the run index live under the git *common* dir (``.git/tilegym-bot/``), and the ledger and
``sandbox/`` under the main working tree (``store_root``), so nothing is lost with a worktree.
Throwaway benchmark worktrees are registered locked with their owner's pid, so ``prune_orphans``
can drop those of a killed run.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import git
from filelock import FileLock, Timeout

from tilegym.atomic import write_json_atomic, write_text_atomic
from tilegym_bot.errors import BotError

MAIN = "main"
WORKTREE_PREFIX = "tilegym-bot-wt-"
_OWNER = "tilegym-bot"


class MainMoved(BotError):
    """``main`` is no longer the commit the experiment was measured against: nothing merged."""

    def __init__(self, measured: str, now: str):
        super().__init__(f"{MAIN} moved from {measured[:8]} to {now[:8]}")
        self.measured, self.now = measured, now


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
        common = self.repo.git.rev_parse("--path-format=absolute", "--git-common-dir")
        self.state_dir = Path(common) / "tilegym-bot"
        self.prs_dir = self.state_dir / "prs"
        self.store_root = self._main_working_tree() or self.root

    def working_trees(self) -> list[Path]:
        """Every checked-out working tree of the repository (main and linked)."""
        listing = self.repo.git.worktree("list", "--porcelain")
        return [
            Path(line[len("worktree ") :])
            for block in listing.split("\n\n")
            if "bare" not in block.splitlines()
            for line in block.splitlines()[:1]
            if line.startswith("worktree ")
        ]

    def _main_working_tree(self) -> Path | None:
        """The repository's main working tree (the first ``git worktree list`` entry); None
        when the repository is bare and only has linked worktrees."""
        first = self.repo.git.worktree("list", "--porcelain").split("\n\n", 1)[0].splitlines()
        if "bare" in first or not first or not first[0].startswith("worktree "):
            return None
        return Path(first[0][len("worktree ") :])

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

    def merge_into_main(self, head: str, message: str, measured: str) -> str:
        """Merge commit of ``head`` into ``measured`` published only while main is still
        ``measured`` (git's compare-and-swap ``update-ref``); MainMoved, nothing merged,
        otherwise. Working tree untouched; returns the new main."""
        now = self.rev(MAIN)
        if now != measured:
            raise MainMoved(measured, now)
        tree, conflicts = self.merge_conflicts(measured, head)
        if tree is None:
            raise BotError(f"merge into {MAIN} would conflict in: {', '.join(conflicts)}")
        commit = self.repo.git.commit_tree(tree, "-p", measured, "-p", head, "-m", message)
        try:
            self.repo.git.update_ref(f"refs/heads/{MAIN}", commit, measured, "-m", message)
        except git.GitCommandError:
            raise MainMoved(measured, self.rev(MAIN)) from None
        return commit

    @contextlib.contextmanager
    def worktree(self, sha: str) -> Iterator[Path]:
        """A detached checkout of ``sha`` in a temporary directory, removed afterwards. It is
        registered locked with this process's id (``git worktree add --lock``, no race), so a
        later run can tell it from a live run's when this one is killed."""
        path = Path(tempfile.mkdtemp(prefix=WORKTREE_PREFIX))
        path.rmdir()
        reason = owner_reason(os.getpid())
        self.repo.git.worktree("add", "--detach", "--lock", "--reason", reason, str(path), sha)
        try:
            yield path
        finally:
            self._drop_worktree(path)

    def _drop_worktree(self, path: Path) -> None:
        with contextlib.suppress(git.GitCommandError):
            self.repo.git.worktree("remove", "--force", "--force", str(path))
        shutil.rmtree(path, ignore_errors=True)

    def prune_orphans(self) -> list[Path]:
        """Drop the registered bot worktrees whose directory is gone or whose owning process
        (on this host) is dead; returns their paths. Those of live runs stay."""
        listing = self.repo.git.worktree("list", "--porcelain")
        orphans = [Path(p) for p in orphaned_worktrees(listing, socket.gethostname(), alive)]
        for path in orphans:
            self._drop_worktree(path)
        return orphans

    @contextlib.contextmanager
    def run_lock(self, branch: str) -> Iterator[None]:
        """One ``experiment run`` of ``branch`` at a time in this repository (any worktree)."""
        locks = self.state_dir / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        name = hashlib.sha256(branch.encode()).hexdigest()[:16]
        lock = FileLock(str(locks / f"run-{name}.lock"), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise BotError(
                f"another `experiment run` of {branch} is in progress in this repository: "
                "wait for it to finish; nothing was changed"
            ) from None
        try:
            yield
        finally:
            lock.release()

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
        """Write a record atomically; a record without a number gets the next free one, unless
        another run recorded the same branch and SHA meanwhile (one record per branch + SHA)."""
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self._lock())
            except Timeout:
                raise BotError(
                    f"{self.state_dir / 'prs.lock'} is held by another process for over a "
                    "minute: nothing recorded; run again"
                ) from None
            if record.get("number") is None:
                twin = self._live_record(record["branch"], record.get("head_sha"))
                if twin is not None:
                    raise BotError(
                        f"PR record #{twin['number']} of {record['branch']} at "
                        f"{str(record.get('head_sha'))[:8]} was written by another run "
                        "meanwhile: nothing recorded; run `experiment run` again"
                    )
                numbers = [int(p.stem) for p in self.prs_dir.glob("*.json")]
                record["number"] = max(numbers, default=0) + 1
                record["created_at"] = now_iso()
            record["updated_at"] = now_iso()
            path = self.prs_dir / f"{record['number']}.json"
            write_json_atomic(path, record, sort_keys=True)
        return record

    def _live_record(self, branch: str, head_sha: str | None) -> dict[str, Any] | None:
        for other in self.pr_records():
            same = (other["branch"], other.get("head_sha")) == (branch, head_sha)
            if same and not other.get("retired"):
                return other
        return None

    def write_report(self, number: int, text: str) -> Path:
        self.prs_dir.mkdir(parents=True, exist_ok=True)
        path = self.prs_dir / f"{number}.md"
        write_text_atomic(path, text)
        return path


# ---- bot worktree ownership (pure, except ``alive``) ---------------------------------------------
def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid; empty
    where /proc does not say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def owner_reason(pid: int) -> str:
    """The lock reason naming a bot worktree's owner: ``tilegym-bot pid=P start=T host=H``."""
    return f"{_OWNER} pid={pid} start={_start_time(pid) or '-'} host={socket.gethostname()}"


def alive(pid: int, start: str) -> bool:
    """Whether process ``pid`` runs and is the one that started at ``start`` ('-': unknown)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return start in ("-", "") or _start_time(pid) in ("", start)


def _orphaned(fields: dict[str, str], host: str, is_alive) -> bool:
    locked = fields.get("locked", "")
    if not Path(fields["worktree"]).is_dir() or not locked.startswith(_OWNER):
        return True
    owner = dict(item.partition("=")[::2] for item in locked.split()[1:])
    pid = owner.get("pid", "")
    return (
        owner.get("host") == host
        and pid.isdigit()
        and not is_alive(int(pid), owner.get("start", "-"))
    )


def orphaned_worktrees(listing: str, host: str, is_alive) -> list[str]:
    """Paths of the bot worktrees in ``git worktree list --porcelain`` output that no live run
    owns: the directory is gone, the owner (on ``host``) is dead, or the registration carries
    no owner (made by a bot that did not lock its worktrees; this one always does)."""
    orphans = []
    for block in listing.split("\n\n"):
        fields = dict(line.partition(" ")[::2] for line in block.splitlines() if line)
        path = fields.get("worktree", "")
        if Path(path).name.startswith(WORKTREE_PREFIX) and _orphaned(fields, host, is_alive):
            orphans.append(path)
    return orphans
