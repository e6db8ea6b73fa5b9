"""What the bot reads from an experiment's commits with main's code, without running them.

Every rule the hook checks the bot checks again here (a commit made with ``--no-verify`` or
pushed from elsewhere skips the hook), and the kernel names that decide what coverage counts
are read from the commits' parsed sources, not from anything the benchmark reported.
"""

from __future__ import annotations

from pathlib import Path

import git
from tilegym_hf_bench.profiling.cutile_names import names_in_sources
from tilegym_hooks import git_io
from tilegym_hooks.paths import KERNEL_SOURCE_ROOT, MAX_PARSED_BYTES
from tilegym_hooks.scope_rules import scope_findings

from tilegym.findings import Finding


def scope_refusals(repo_dir: Path, base_sha: str, head_sha: str, model_key: str) -> list[Finding]:
    """The experiment-scope findings of ``base_sha...head_sha`` (parsing only)."""
    repo = git_io.open_repo(Path(repo_dir))
    try:
        return scope_findings(model_key, git_io.changes_between(repo, base_sha, head_sha))
    finally:
        repo.close()


def kernel_names_at(repo_dir: Path, sha: str) -> frozenset[str]:
    """The ``@ct.kernel`` function names defined under src/tilegym at ``sha``."""
    repo = git_io.open_repo(Path(repo_dir))
    try:
        try:
            tree = repo.commit(sha).tree
        except (ValueError, git.BadName, git.GitCommandError):
            raise git_io.GitError(f"commit {sha!r} does not exist in {repo_dir}") from None
        try:
            root = tree / KERNEL_SOURCE_ROOT
        except KeyError:
            return frozenset()
        sources = (
            blob.data_stream.read(MAX_PARSED_BYTES + 1)
            for blob in root.traverse()
            if blob.type == "blob" and blob.path.endswith(".py")
        )
        return names_in_sources(sources)
    finally:
        repo.close()
