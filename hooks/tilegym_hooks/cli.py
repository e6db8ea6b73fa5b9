"""``tilegym-hooks``: the scope, prefix and sandbox guards as pre-commit entry points.

Exit codes (DESIGN.md): 0 clean, 1 findings or an ``error:`` line, 2 usage.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import git

from tilegym.findings import report
from tilegym_hooks import git_io
from tilegym_hooks.prefix_guard import check_prefixes
from tilegym_hooks.sandbox_guard import sandbox_findings
from tilegym_hooks.scope_rules import MODEL_KEY_RE, model_key_from_branch, scope_findings

BASE_ENV = "TILEGYM_SCOPE_BASE"


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


def _model_key(value: str) -> str:
    if not MODEL_KEY_RE.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a model key (e.g. qwen3, gpt_neox)")
    return value


def _experiment_model_key(repo, args: argparse.Namespace) -> str | None:
    """The flag, else the key in ``experiment/<K>/<slug>``; None off experiment branches."""
    if args.model_key is not None:
        return args.model_key
    branch = git_io.current_branch(repo)
    try:
        model_key = model_key_from_branch(branch) if branch else None
    except ValueError as exc:
        raise git_io.GitError(str(exc)) from None
    if model_key is None and args.require_experiment:
        where = f"branch {branch!r}" if branch else "a detached HEAD"
        raise git_io.GitError(f"{where} is not experiment/<model_key>/<slug>; pass --model-key")
    return model_key


def run_scope(args: argparse.Namespace) -> int:
    repo = git_io.open_repo(Path(args.repo_root or "."))
    try:
        model_key = _experiment_model_key(repo, args)
        if model_key is None:
            return 0
        try:
            changes = git_io.changes_since(repo, args.base, against_index=args.index)
        except git_io.MissingBase as exc:
            if not args.skip_missing_base:
                raise
            print(f"scope: skipped: {exc}")
            return 0
        return report(scope_findings(model_key, changes))
    finally:
        repo.close()


def run_prefixes(args: argparse.Namespace) -> int:
    root = Path(args.repo_root) if args.repo_root else git_io.work_tree_root(Path.cwd())
    return report(check_prefixes(root))


def run_sandbox(args: argparse.Namespace) -> int:
    repo = git_io.open_repo(Path(args.repo_root or "."))
    try:
        return report(sandbox_findings(git_io.indexed_paths(repo)))
    finally:
        repo.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tilegym-hooks", description="TileGym repository guards (pre-commit hooks)."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    scope = commands.add_parser(
        "scope", help="an experiment branch changes only what its model may change"
    )
    scope.add_argument(
        "--base",
        default=os.environ.get(BASE_ENV) or "main",
        help=f"compare REF...HEAD (default: ${BASE_ENV}, else main)",
        metavar="REF",
    )
    scope.add_argument(
        "--model-key", type=_model_key, help="model key (default: from experiment/<K>/<slug>)"
    )
    scope.add_argument(
        "--require-experiment",
        action="store_true",
        help="fail when no model key is given and the branch is not an experiment branch",
    )
    scope.add_argument(
        "--index",
        action="store_true",
        help="compare against the git index (what the next commit holds) instead of HEAD",
    )
    scope.add_argument(
        "--skip-missing-base",
        action="store_true",
        help="pass with a message when the base ref does not exist (shallow clones)",
    )
    scope.set_defaults(run=run_scope)

    prefixes = commands.add_parser(
        "prefixes", help="every coverage prefix names a @ct.kernel function under src/tilegym"
    )
    prefixes.set_defaults(run=run_prefixes)

    sandbox = commands.add_parser(
        "sandbox", help="nothing under sandbox/ is committed but README.md and .gitignore"
    )
    sandbox.set_defaults(run=run_sandbox)

    for command in (scope, prefixes, sandbox):
        command.add_argument(
            "--repo-root", metavar="DIR", help="repository root (default: the one around .)"
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except git_io.GitError as exc:
        return _error(str(exc))
    except git.GitCommandError as exc:
        return _error(f"git {exc.command[1] if len(exc.command) > 1 else ''}: {exc.stderr.strip()}")
    except KeyboardInterrupt:
        return _error("interrupted")
    except Exception as exc:  # the contract: one line, never a traceback
        return _error(f"{type(exc).__name__}: {exc}")
