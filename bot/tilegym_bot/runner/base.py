"""What an executor is asked to run and what it hands back, plus the exit-to-status rules.

Both executors end the same way: the bench's own metrics file is kept when it is schema-valid
and names the benchmarked commit; otherwise (crash, kill, timeout, garbage) a schema-valid
metrics file with status ``crash``/``timeout`` and the error text is written in its place, so
the decision step always has two files to read.
"""

from __future__ import annotations

import json
import os
import platform
import signal
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePath
from typing import Any

from tilegym_hf_bench.metrics_schema import SCHEMA_ID, validation_errors

from tilegym.atomic import write_json_atomic

BENCH_MODULE = "tilegym_hf_bench._cli"
# The code under test: the only source root taken from the benchmarked commit.
EXPERIMENT_ROOTS = ("src",)
# The harness that measures it (benchmark, classifier, correctness, bot, hooks): always taken from
# the trusted tree (main / the PR's base), so the experiment never measures itself.
HARNESS_ROOTS = ("modeling/transformers/src", "bot", "hooks")
STDERR_TAIL_LINES = 20


@dataclass
class BenchRequest:
    repo_dir: Path
    commit: str
    bench_args: list[str]
    metrics_out: Path
    log_dir: Path
    timeout_s: float = 900.0
    gpu_uuid: str | None = None
    # The trusted checkout whose harness measures ``repo_dir``'s ``src/``; None: the checkout
    # measures itself (a plain benchmark of one tree, e.g. main as the base).
    harness_dir: Path | None = None


@dataclass
class BenchResult:
    status: str
    returncode: int | None
    metrics_path: Path
    stdout_log: Path
    stderr_log: Path
    wall_s: float


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def source_path(experiment_root: PurePath, harness_root: PurePath | None = None) -> list[str]:
    """PYTHONPATH entries (ahead of any installed copy): the experiment's ``src/`` and the
    harness packages of ``harness_root`` (the experiment's own when None)."""
    harness = experiment_root if harness_root is None else harness_root
    return [str(experiment_root / rel) for rel in EXPERIMENT_ROOTS] + [
        str(harness / rel) for rel in HARNESS_ROOTS
    ]


def log_paths(request: BenchRequest) -> tuple[Path, Path]:
    stem = f"bench-{request.commit[:12]}"
    return request.log_dir / f"{stem}.stdout.log", request.log_dir / f"{stem}.stderr.log"


def head_mismatch(repo_dir: Path, commit: str) -> str | None:
    """Why ``repo_dir`` is not a checkout of ``commit``, or None when it is."""
    import git

    try:
        head = git.Repo(repo_dir).head.commit.hexsha
    except (git.exc.InvalidGitRepositoryError, git.exc.NoSuchPathError):
        return f"{repo_dir} is not a git checkout"
    except ValueError as exc:  # a repository with no commit yet
        return f"{repo_dir} has no HEAD commit: {exc}"
    if head != commit:
        return f"{repo_dir} is at {head}, not at the commit to benchmark {commit}"
    return None


def with_commit(request: BenchRequest) -> list[str]:
    """The bench arguments plus ``--commit SHA`` (unless given): the run records that commit
    even where git cannot read the checkout (a worktree mounted into a container)."""
    if flag_value(request.bench_args, "--commit") is not None:
        return list(request.bench_args)
    return [*request.bench_args, "--commit", request.commit]


def flag_value(args: list[str], flag: str) -> str | None:
    """Value of ``--flag V`` or ``--flag=V`` in an argument list (last one wins)."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def _int_flag(args: list[str], flag: str, default: int) -> int:
    value = flag_value(args, flag)
    try:
        return max(1, int(value)) if value is not None else default
    except ValueError:
        return default


def synthesize_metrics(
    request: BenchRequest, status: str, error: str, started_at: str, wall_s: float
) -> dict[str, Any]:
    """A schema-valid metrics document for a run that produced none of its own.

    Only what the request itself says is filled in; everything measured is null.
    """
    args = request.bench_args
    model_id = flag_value(args, "--model-id")
    return {
        "schema": SCHEMA_ID,
        "status": status,
        "error": error,
        "model_key": flag_value(args, "--model-key") or "unknown",
        "model_id": model_id,
        "weights": "pretrained" if model_id else "random",
        "commit": request.commit,
        "started_at": started_at,
        "wall_s": round(max(wall_s, 0.0), 3),
        "env": {
            "gpu_name": None,
            "gpu_uuid": request.gpu_uuid,
            "compute_capability": None,
            "driver": None,
            "cuda": None,
            "torch": None,
            "transformers": None,
            "cuda_tile": None,
            "tileiras": None,
            "python": platform.python_version(),
        },
        "workload": {
            "name": flag_value(args, "--workload") or "default",
            "batch_size": _int_flag(args, "--batch-size", 1),
            "input_length": _int_flag(args, "--input-length", 1),
            "output_length": _int_flag(args, "--output-length", 1),
            "warmup_runs": 0,
            "timed_runs": 1,
            "seed": 0,
        },
        "baseline": None,
        "cutile": None,
        "coverage": None,
        "correctness": None,
    }


def read_metrics(path: Path, commit: str) -> tuple[dict[str, Any] | None, str | None]:
    """The bench's metrics document if usable, else None and why not."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None, "no metrics file was written"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"metrics file is not JSON: {exc}"
    errors = validation_errors(doc)
    if errors:
        return None, f"metrics file breaks the schema: {errors[0]}"
    if doc["commit"] != commit:
        return None, f"metrics file names commit {doc['commit']}, not the benchmarked {commit}"
    return doc, None


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "did not start"
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def classify(
    returncode: int | None,
    timed_out: bool,
    doc: dict[str, Any] | None,
    problem: str | None,
    timeout_s: float,
    stderr_tail: str = "",
) -> tuple[str, str | None, bool]:
    """(status, error, synthesize): how one finished run is recorded. Pure.

    A timeout always wins (whatever the killed bench left behind is not trusted); a valid
    metrics file is the bench's own word on its status; anything else is a crash.
    """
    if timed_out:
        error = f"benchmark exceeded the {timeout_s:g} s limit and was killed"
        return "timeout", _with_tail(error, stderr_tail), True
    if doc is not None:
        return doc["status"], doc["error"], False
    error = f"benchmark {describe_exit(returncode)} and {problem or 'wrote no metrics'}"
    return "crash", _with_tail(error, stderr_tail), True


def _with_tail(error: str, stderr_tail: str) -> str:
    return f"{error}; stderr tail:\n{stderr_tail}" if stderr_tail.strip() else error


def tail(path: Path, lines: int = STDERR_TAIL_LINES) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def finish(
    request: BenchRequest,
    *,
    returncode: int | None,
    timed_out: bool,
    started_at: str,
    wall_s: float,
    stdout_log: Path,
    stderr_log: Path,
    error: str | None = None,
    note: str = "",
) -> BenchResult:
    """Record a finished (or never started, when ``error`` is given) run; see module doc.

    ``note`` is what the executor saw beyond the exit status (e.g. out of memory).
    """
    if error is not None:
        status, synth = "crash", True
    else:
        doc, problem = read_metrics(request.metrics_out, request.commit)
        if note:
            problem = f"{problem or 'wrote no metrics'} ({note})"
        status, error, synth = classify(
            returncode, timed_out, doc, problem, request.timeout_s, tail(stderr_log)
        )
    if synth:
        doc = synthesize_metrics(request, status, error or status, started_at, wall_s)
        write_json_atomic(request.metrics_out, doc)
    return BenchResult(status, returncode, request.metrics_out, stdout_log, stderr_log, wall_s)


def prepare(request: BenchRequest) -> tuple[Path, Path]:
    """Create the log files and remove a stale metrics file so it is never mistaken for new."""
    request.log_dir.mkdir(parents=True, exist_ok=True)
    request.metrics_out.parent.mkdir(parents=True, exist_ok=True)
    request.metrics_out.unlink(missing_ok=True)
    stdout_log, stderr_log = log_paths(request)
    stdout_log.write_bytes(b"")
    stderr_log.write_bytes(b"")
    return stdout_log, stderr_log
