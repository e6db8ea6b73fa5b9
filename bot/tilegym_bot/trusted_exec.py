"""Run ``experiment run`` with main's code, never the experiment's.

In a checkout of this repository installed in editable mode, ``tilegym-bot`` imports its code
from the work tree, which during an experiment holds the experiment's branch: the code that
judges the experiment would be the experiment's own. So, when the running bot's package lies
inside any working tree of the repository (the run's, or another worktree's), the command
re-executes itself from a snapshot of main (bot-owned storage under
``.git/tilegym-bot/trusted/<sha>/``, extracted from git, never from the work tree).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from filelock import FileLock

from tilegym_bot.errors import BotError
from tilegym_bot.forge.local import MAIN, LocalForge
from tilegym_bot.runner.base import source_path

TRUSTED_ENV = "TILEGYM_BOT_TRUSTED_TREE"
BOT_PACKAGE = Path(__file__).resolve().parent


def runs_from_work_tree(forge: LocalForge, package_dir: Path = BOT_PACKAGE) -> bool:
    """True when the bot's own code is a file of any working tree of the repository: the
    branch being judged, or another experiment checked out in another worktree (an editable
    install of the main working tree judging a run in a linked one)."""
    return any(package_dir.is_relative_to(tree.resolve()) for tree in forge.working_trees())


def snapshot(forge: LocalForge, sha: str) -> Path:
    """main's tree at ``sha`` extracted under .git/tilegym-bot/trusted/ (once per SHA; the
    snapshots of earlier mains are removed)."""
    root = forge.state_dir / "trusted"
    target = root / sha
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / ".lock"), timeout=300):
        if target.is_dir():
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{sha[:8]}-", dir=root))
        try:
            with tempfile.TemporaryFile() as archive:
                forge.repo.archive(archive, treeish=sha, format="tar")
                archive.seek(0)
                with tarfile.open(fileobj=archive) as tar:
                    tar.extractall(staging, filter="data")
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        for old in root.iterdir():  # snapshots of earlier mains: nothing runs from them now
            if old.is_dir() and old != target:
                shutil.rmtree(old, ignore_errors=True)
    return target


def reexec_from_main(forge: LocalForge, argv: list[str]) -> int | None:
    """Exit code of the same command run from main's snapshot; None when this process already
    runs trusted code (re-executed, or a bot installed outside the work tree)."""
    if os.environ.get(TRUSTED_ENV) or not runs_from_work_tree(forge):
        return None
    sha = forge.rev(MAIN)
    tree = snapshot(forge, sha)
    if not (tree / "bot" / "tilegym_bot").is_dir():
        raise BotError(f"{MAIN} ({sha[:8]}) has no bot/tilegym_bot: cannot judge with main's code")
    env = dict(os.environ)
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([*source_path(tree), *inherited])
    env[TRUSTED_ENV] = sha
    print(f"tilegym-bot: judging with {MAIN}'s code ({sha[:8]}, {tree})", file=sys.stderr)
    return subprocess.call([sys.executable, "-m", "tilegym_bot", *argv], env=env)
