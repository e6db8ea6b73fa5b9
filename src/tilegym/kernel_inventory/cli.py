"""``tilegym-inventory``: check, compile and parity-test the kernel inventory.

Exit codes: 0 nothing found, 1 findings (one ``path:line: CODE message`` line each) or a
runtime error (one ``error: ...`` line), 2 usage error (one ``error: ...`` line), 143 stopped
by SIGTERM (a time limit's ``timeout``; the compile workers are stopped with it).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from tilegym.findings import report

USAGE_EXIT = 2
TERMINATED_EXIT = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be, so the same cleanup runs: without it the process
    ends at once and its compile workers live on, orphaned."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage problem as one ``error:`` line and exit code 2."""

    def error(self, message: str):  # type: ignore[override]
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(USAGE_EXIT)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tilegym-inventory",
        description="Check, compile and parity-test the kernel inventory.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("paths", nargs="*", type=Path, metavar="PATH")
        p.add_argument(
            "--repo-root",
            type=Path,
            default=None,
            help="repository root (default: nearest directory with .git above the cwd)",
        )

    check = sub.add_parser("check", help="validate Definition/Solution files (all when none given)")
    common(check)
    check.add_argument(
        "--verify-sources",
        action="store_true",
        help="also read each cited permalink region (clone or HTTPS) and check it exists",
    )
    check.add_argument(
        "--source-repo",
        action="append",
        default=[],
        metavar="OWNER/REPO=PATH",
        help="local clone to read permalinks of OWNER/REPO from (repeatable; also "
        "TILEGYM_SOURCE_REPOS='A/B=PATH;C/D=PATH')",
    )
    check.add_argument("--no-cache", action="store_true", help="ignore the permalink cache")

    compile_ = sub.add_parser(
        "compile", help="AOT-compile each Solution's kernels for its target_hardware (no GPU)"
    )
    common(compile_)
    compile_.add_argument("--no-cache", action="store_true", help="ignore the compile cache")
    compile_.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="compile in this many worker processes (default: CPU count, at most 8)",
    )

    parity = sub.add_parser("parity", help="run Solutions against their reference on a device")
    common(parity)
    parity.add_argument("--device", default="cuda", help="torch device (default: cuda)")
    parity.add_argument("--seed", type=int, default=0)
    parity.add_argument("--shapes", type=int, default=4, help="shapes per Solution (default 4)")

    sub.add_parser("codes", help="print the table of finding codes")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else USAGE_EXIT
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main_thread else None
    try:
        return _run(args)
    except Terminated:
        print("error: terminated (SIGTERM)", file=sys.stderr)
        return TERMINATED_EXIT
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 1
    except Exception as exc:  # the contract: one line, never a traceback
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"error: {type(exc).__name__}: {message}", file=sys.stderr)
        return 1
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace) -> int:
    if args.command == "codes":
        from tilegym.kernel_inventory.codes import CODES

        for code, summary in CODES.items():
            print(f"{code}  {summary}")
        return 0

    from tilegym.kernel_inventory.inventory import find_repo_root

    repo_root = (args.repo_root or find_repo_root()).resolve()
    if not repo_root.is_dir():
        print(f"error: --repo-root {repo_root} is not a directory", file=sys.stderr)
        return USAGE_EXIT

    if args.command == "check":
        from tilegym.kernel_inventory.check import check_paths
        from tilegym.kernel_inventory.sources import SourceVerifier

        verifier = None
        if args.verify_sources:
            try:
                verifier = SourceVerifier.from_environment(
                    args.source_repo, use_cache=not args.no_cache
                )
            except ValueError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return USAGE_EXIT
        elif args.source_repo:
            print("error: --source-repo only makes sense with --verify-sources", file=sys.stderr)
            return USAGE_EXIT
        return report(check_paths(args.paths, repo_root, verifier=verifier))

    if args.command == "compile":
        from tilegym.kernel_inventory.compile import compile_paths, default_jobs

        jobs = default_jobs() if args.jobs is None else args.jobs
        if jobs < 1:
            print("error: --jobs must be at least 1", file=sys.stderr)
            return USAGE_EXIT
        findings = compile_paths(
            args.paths, repo_root, use_cache=not args.no_cache, jobs=jobs, progress=_progress
        )
        return report(findings)

    if args.command == "parity":
        import torch

        from tilegym.kernel_inventory.parity import parity_paths

        try:
            device = torch.device(args.device)
        except (RuntimeError, ValueError) as exc:
            print(f"error: bad --device {args.device!r}: {exc}", file=sys.stderr)
            return USAGE_EXIT
        if device.type == "cuda" and not torch.cuda.is_available():
            print("error: --device cuda requested but no CUDA GPU is available", file=sys.stderr)
            return 1
        if args.shapes < 1:
            print("error: --shapes must be at least 1", file=sys.stderr)
            return USAGE_EXIT
        findings = parity_paths(
            args.paths, repo_root, device=device, seed=args.seed, n_shapes=args.shapes
        )
        return report(findings)
    raise AssertionError(f"unhandled command {args.command}")


def _progress(line: str) -> None:
    """One line per kernel compiled, on stderr (stdout holds only findings)."""
    print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
