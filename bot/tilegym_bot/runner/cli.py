"""``tilegym-bot runner ...``: benchmark one commit, serve a GPU queue, check an artifact, and
say whether the GitHub job's sequential sampling takes another base/head pair (``next-pair``).

``register(subparsers)`` plugs these into the ``tilegym-bot`` parser; every leaf parser sets
``func(args) -> int``. ``main(argv)`` runs them standalone (``python -m tilegym_bot.runner.cli``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path

from tilegym_bot.errors import BotError
from tilegym_bot.runner.base import HARNESS_ROOTS, BenchRequest

MIB = 1024 * 1024


def _executor(args: argparse.Namespace):
    if args.executor == "docker":
        from tilegym_bot.runner.docker import DockerExecutor, parse_cpusets

        return DockerExecutor(
            args.image,
            memory_limit=args.memory,
            pids_limit=args.pids_limit,
            cpusets=parse_cpusets(args.cpuset),
            out_bytes=args.max_output_mib * MIB,
            log_bytes=args.max_log_mib * MIB,
        )
    from tilegym_bot.runner.local import LocalExecutor

    return LocalExecutor()


def _check_executor_args(args: argparse.Namespace, gpus: list[str]) -> str | None:
    """Why the executor flags cannot work for ``gpus`` (None: they can)."""
    if args.executor == "docker" and not args.image:
        return "--image is required with --executor docker"
    if args.pids_limit < 1 or args.max_output_mib < 1 or args.max_log_mib < 1:
        return "--pids-limit, --max-output-mib and --max-log-mib must be positive"
    if args.executor != "docker":
        return None
    from tilegym_bot.runner.docker import ANY_GPU, parse_cpusets

    try:
        cpusets = parse_cpusets(args.cpuset)
    except ValueError as exc:
        return f"--cpuset (or TILEGYM_CPUSET): {exc}"
    if cpusets and ANY_GPU not in cpusets:
        missing = [gpu for gpu in gpus if gpu not in cpusets] or ([] if gpus else ["no GPU"])
        if missing:
            return f"--cpuset (or TILEGYM_CPUSET) gives no CPU set for {', '.join(missing)}"
    return None


def _check_harness(harness: str | None) -> str | None:
    if harness is None:
        return None
    missing = [rel for rel in HARNESS_ROOTS if not (Path(harness) / rel).is_dir()]
    if missing:
        return f"--harness {harness} is not a checkout with {', '.join(missing)}"
    return None


def _bench(args: argparse.Namespace) -> int:
    from tilegym_bot.runner.gpulock import GpuLockedExecutor

    problem = _check_executor_args(args, [args.gpu_uuid] if args.gpu_uuid else [])
    problem = problem or _check_harness(args.harness)
    bench_args = args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args
    if problem is None and not bench_args:
        problem = "no benchmark arguments: pass them after `--`, e.g. -- --model-key qwen3"
    if problem is None and args.timeout <= 0:
        problem = "--timeout must be positive"
    commit = args.commit
    if problem is None and commit is None:
        import git

        try:
            commit = git.Repo(args.repo).head.commit.hexsha
        except (git.exc.GitError, ValueError) as exc:
            problem = f"cannot read HEAD of {args.repo}: {exc}"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    metrics_out = Path(args.metrics_out)
    request = BenchRequest(
        repo_dir=Path(args.repo),
        commit=commit,
        bench_args=bench_args,
        metrics_out=metrics_out,
        log_dir=Path(args.log_dir) if args.log_dir else metrics_out.parent / "logs",
        timeout_s=args.timeout,
        gpu_uuid=args.gpu_uuid,
        harness_dir=Path(args.harness) if args.harness else None,
    )
    result = GpuLockedExecutor(_executor(args), args.lock_dir).run(request)
    print(
        f"runner: {commit[:12]}: {result.status} (exit {result.returncode}, "
        f"{result.wall_s:.1f} s) -> {result.metrics_path}; logs {result.stderr_log}"
    )
    return 0 if result.status == "ok" else 1


def _serve(args: argparse.Namespace) -> int:
    from tilegym_bot.runner.jobqueue import serve

    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    problem = _check_executor_args(args, gpus)
    if problem is None and not gpus:
        problem = "--gpus needs at least one GPU UUID"
    if problem is None and len(set(gpus)) != len(gpus):
        problem = "--gpus lists a GPU twice"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    stop = threading.Event()
    # SIGTERM (a service stop) like Ctrl-C: take no new request, let the running ones finish.
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set()) if in_main else None
    try:
        return serve(
            Path(args.queue),
            gpus,
            lambda: _executor(args),
            once=args.once,
            poll_s=args.poll,
            lock_dir=args.lock_dir,
            stop=stop,
        )
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _check_artifact(args: argparse.Namespace) -> int:
    from tilegym.findings import report
    from tilegym_bot.runner.artifact import check_artifact

    record, findings = check_artifact(
        Path(args.dir),
        args.expect_head_sha,
        expect_base_sha=args.expect_base_sha,
        expect_pr=args.expect_pr,
        expect_model_key=args.expect_model_key,
    )
    if record is None:
        return report(findings) or 1
    lines = [f"{key}={record[key]}" for key in ("pr", "base_sha", "head_sha")]
    print("\n".join(lines))
    if args.github_output:
        with open(args.github_output, "a") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


def _read_pairs(folder: Path) -> tuple[list, list]:
    """The metrics documents of the pairs in ``folder`` so far (pair files of
    ``runner.artifact``), BotError for a half pair, an unreadable file or no pair at all."""
    from tilegym_bot.runner.artifact import pair_files

    bases, heads = [], []
    for k in range(1, 10_000):
        names = pair_files(k)
        there = [(folder / n).is_file() for n in names]
        if not any(there):
            break
        if not all(there):
            missing = names[there.index(False)]
            raise BotError(f"pair {k} in {folder} is not whole: {missing} is missing")
        docs = []
        for name in names:
            try:
                docs.append(json.loads((folder / name).read_text(encoding="utf-8")))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise BotError(f"{folder / name} is not readable JSON: {exc}") from exc
        bases.append(docs[0])
        heads.append(docs[1])
    if not heads:
        raise BotError(f"no pair in {folder}: {' and '.join(pair_files(1))} are missing")
    return bases, heads


def _kernels(repo: str | None) -> frozenset[str] | None:
    if repo is None:
        return None
    from tilegym_hooks.git_io import GitError

    from tilegym_bot.trusted_tree import kernel_names_at

    try:
        return kernel_names_at(Path(repo), "HEAD")
    except GitError as exc:
        raise BotError(f"cannot read the @ct.kernel names of {repo}: {exc}") from exc


def _next_pair(args: argparse.Namespace) -> int:
    """After each pair the GitHub job asks this whether to stop and, if not, the next pair's
    timed runs: ``sequential.assess`` (the local loop's rule) on the files so far, the budget
    counted from ``--started-at`` by this machine's clock."""
    from tilegym_bot import sequential

    problem = None
    if not (math.isfinite(args.budget) and args.budget >= 0):
        problem = f"--budget must be a finite number of seconds >= 0, got {args.budget}"
    elif not (0.0 <= args.margin < 1.0):
        problem = f"--margin must be in [0, 1), got {args.margin}"
    elif not math.isfinite(args.started_at) or args.started_at > time.time() + 60:
        problem = f"--started-at {args.started_at} is not a past epoch time in seconds"
    elif (args.base_repo is None) != (args.head_repo is None):
        problem = "--base-repo and --head-repo go together"
    elif not Path(args.dir).is_dir():
        problem = f"{args.dir} is not a folder"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    bases, heads = _read_pairs(Path(args.dir))
    docs = [*bases, *heads]
    step = sequential.assess(
        bases,
        heads,
        margin=args.margin,
        elapsed_s=time.time() - args.started_at,
        budget_s=args.budget,
        cost=sequential.cost_of(sequential.walls_of(docs)),
        base_kernels=_kernels(args.base_repo),
        head_kernels=_kernels(args.head_repo),
    )
    k = len(heads) + 1
    lines = [f"stop={'true' if step.stop else 'false'}", f"pairs={len(heads)}"]
    if step.stop:
        lines.append(f"stopped={step.stopped}")
    else:
        # head first in odd pairs, base first in even ones, as the local loop
        lines += [f"next={k}", f"runs={step.runs}", f"first={'head' if k % 2 else 'base'}"]
    lines.append("why=" + " ".join(step.why.split()))
    print("\n".join(lines))
    if args.github_output:
        with open(args.github_output, "a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


def _add_executor_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--executor", choices=("local", "docker"), default="local")
    parser.add_argument("--image", help="experiment image (with --executor docker)")
    parser.add_argument("--memory", default="64g", help="container memory limit (docker)")
    parser.add_argument(
        "--pids-limit", type=int, default=4096, help="most processes in the container (docker)"
    )
    parser.add_argument(
        "--cpuset",
        default=os.environ.get("TILEGYM_CPUSET") or None,
        help="CPUs of the container (docker): a list like 0-15 for every GPU, or per GPU "
        "'GPU-a=0-15;GPU-b=16-31' (default: $TILEGYM_CPUSET, e.g. from the runner's .env)",
    )
    parser.add_argument(
        "--max-output-mib",
        type=int,
        default=64,
        help="a run that writes more into its output folder is killed (docker)",
    )
    parser.add_argument(
        "--max-log-mib", type=int, default=64, help="each log stream is cut past this (docker)"
    )
    parser.add_argument("--lock-dir", type=Path, default=None, help="per-GPU lock files")


def register(subparsers) -> None:
    runner = subparsers.add_parser("runner", help="run benchmarks on this host's GPUs")
    sub = runner.add_subparsers(dest="runner_command", required=True, metavar="COMMAND")

    bench = sub.add_parser(
        "bench",
        help="benchmark one checkout: ... bench --metrics-out F -- <tilegym-hf-bench args>",
    )
    bench.add_argument("--repo", default=".", help="checkout of the commit to benchmark")
    bench.add_argument("--commit", help="40-hex SHA the checkout must be at (default: its HEAD)")
    bench.add_argument("--metrics-out", required=True)
    bench.add_argument("--log-dir", help="default: <metrics-out folder>/logs")
    bench.add_argument("--gpu-uuid", help="GPU to use (nvidia-smi -L), e.g. GPU-1a2b...")
    bench.add_argument("--timeout", type=float, default=900.0, help="hard limit in seconds")
    bench.add_argument(
        "--harness",
        help="trusted checkout (e.g. the PR's base) whose benchmark, classifier, bot and hooks "
        "measure --repo's src/ (default: --repo measures itself)",
    )
    _add_executor_flags(bench)
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(func=_bench)

    serve = sub.add_parser("serve", help="serve a queue folder of requests, one worker per GPU")
    serve.add_argument("--gpus", required=True, help="comma-separated GPU UUIDs")
    serve.add_argument("--queue", required=True, help="queue folder (see runner.jobqueue)")
    serve.add_argument("--once", action="store_true", help="drain the queue, then exit")
    serve.add_argument("--poll", type=float, default=5.0, help="seconds between empty polls")
    _add_executor_flags(serve)
    serve.set_defaults(func=_serve)

    check = sub.add_parser("check-artifact", help="validate a downloaded benchmark artifact")
    check.add_argument("dir")
    check.add_argument("--expect-head-sha", help="the head SHA GitHub says was benchmarked")
    check.add_argument("--expect-base-sha", help="the base SHA GitHub says was benchmarked")
    check.add_argument("--expect-pr", type=int, help="the PR number GitHub gives for the head")
    check.add_argument("--expect-model-key", help="the model key of the PR's branch")
    check.add_argument("--github-output", help="also append pr=/base_sha=/head_sha= here")
    check.set_defaults(func=_check_artifact)

    nxt = sub.add_parser(
        "next-pair",
        help="after a base/head pair of the GitHub job: stop, or the next pair's timed runs",
    )
    nxt.add_argument("dir", help="folder of the pairs so far (runner.artifact's file names)")
    nxt.add_argument(
        "--budget", type=float, required=True, help="seconds of sampling (the job's budget)"
    )
    nxt.add_argument(
        "--started-at",
        type=float,
        required=True,
        help="epoch seconds when the first benchmark started (date +%%s)",
    )
    nxt.add_argument("--margin", type=float, default=0.02, help="the decision's margin")
    nxt.add_argument("--base-repo", help="base checkout (at the base SHA): its @ct.kernel names")
    nxt.add_argument("--head-repo", help="head checkout (at the head SHA): its @ct.kernel names")
    nxt.add_argument("--github-output", help="also append the key=value lines here")
    nxt.set_defaults(func=_next_pair)


class _Parser(argparse.ArgumentParser):
    """Bad flags are one ``error:`` line (exit 2), like ``tilegym-bot`` itself."""

    def error(self, message: str):
        print(f"error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="tilegym-bot")
    register(parser.add_subparsers(dest="command", required=True, parser_class=_Parser))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BotError as exc:
        for line in exc.details:
            print(line, file=sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
