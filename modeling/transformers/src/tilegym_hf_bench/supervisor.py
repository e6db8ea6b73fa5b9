"""Runs the worker in its own process group under a hard time limit and turns whatever it
left behind into the metrics document. Torch-free: it must stay responsive while the worker
hangs in a CUDA call or a compile."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tilegym_hf_bench.experiment_tree import MEASURED_SRC_ENV, ExperimentTreeError, measured_tree
from tilegym_hf_bench.metrics import assemble, write_atomic
from tilegym_hf_bench.options import BenchOptions
from tilegym_hf_bench.profiling.attribution import aggregate, coverage_block, recount
from tilegym_hf_bench.profiling.nsys_trace import NsysError, nsys_command, read_sqlite
from tilegym_hf_bench.progress import read_progress
from tilegym_hf_bench.report import coverage_table_lines

KILL_GRACE_S = 5.0
CUTILE_CACHE_DIR = Path("~/.cache/tilegym/cutile").expanduser()


@dataclass
class Outcome:
    status: str  # ok | crash | timeout | refused
    error: str | None
    progress: dict


def worker_env() -> dict[str, str]:
    """The measuring process's environment: our package importable, the measured tree's
    ``src/`` NOT on its path (only the model worker it starts gets it: ``worker_pythonpath``),
    unbuffered output, and cuTile's on-disk compile cache under ~/.cache/tilegym/cutile unless
    the caller chose one."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parent.parent)
    tree = measured_tree()
    src = tree.package_dir.parent if tree.package_dir is not None else None
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["TILEGYM_WORKER_PYTHONPATH"] = os.pathsep.join(
        [*([str(src)] if src else []), package_root, *inherited]
    )
    env[MEASURED_SRC_ENV] = str(src) if src else ""
    trusted = [p for p in inherited if src is None or Path(p).resolve() != src]
    env["PYTHONPATH"] = os.pathsep.join([package_root, *trusted])
    env["PYTHONUNBUFFERED"] = "1"
    if "CUDA_TILE_CACHE_DIR" not in env:
        CUTILE_CACHE_DIR.mkdir(parents=True, exist_ok=True)
        env["CUDA_TILE_CACHE_DIR"] = str(CUTILE_CACHE_DIR)
    return env


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_group(proc: subprocess.Popen, pgid: int) -> None:
    """SIGTERM the whole group, SIGKILL what is left after a grace period, reap the leader."""
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_alive(pgid):
                break
            time.sleep(0.05)
        if not _group_alive(pgid):
            break
    proc.wait()


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def run_worker(options: BenchOptions, nsys: str | None = None) -> Outcome:
    """Run the worker (under ``nsys`` when given) and collect its outcome."""
    with tempfile.TemporaryDirectory(prefix="tilegym-bench-") as tmp:
        request, progress_file = Path(tmp, "request.json"), Path(tmp, "progress.json")
        request.write_text(json.dumps(options.to_json()))
        report_base = Path(tmp, "nsys-report")
        prefix = nsys_command(nsys, report_base) if nsys else []
        cmd = [*prefix, sys.executable, "-m", "tilegym_hf_bench.worker"]
        cmd += [str(request), str(progress_file)]
        proc = subprocess.Popen(cmd, env=worker_env(), start_new_session=True)
        pgid = proc.pid
        print(f"worker: pid {proc.pid}, process group {pgid}, time limit {options.timeout_s:g} s")
        sys.stdout.flush()
        timed_out = interrupted = False
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            proc.wait(timeout=options.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        except KeyboardInterrupt:
            interrupted = True
        finally:
            signal.signal(signal.SIGTERM, previous)
            kill_group(proc, pgid)
        progress = read_progress(progress_file) or {}
        nsys_failure = None
        if progress.get("status") == "ok" and progress.get("coverage_pending") == "nsys":
            nsys_failure = _finish_nsys_coverage(progress, report_base.with_suffix(".sqlite"))
    if nsys_failure is not None:
        return Outcome("crash", nsys_failure, progress)
    recount_failure = _recount_coverage(progress)
    if recount_failure is not None:
        return Outcome("crash", recount_failure, progress)
    if timed_out:
        return Outcome(
            "timeout",
            f"timed out after {options.timeout_s:g} s (worker process group {pgid} killed)",
            progress,
        )
    if interrupted:
        return Outcome("crash", "interrupted (worker process group killed)", progress)
    state = progress.get("status")
    if state == "ok" and proc.returncode == 0:
        return Outcome("ok", None, progress)
    if state == "crash":
        return Outcome("crash", progress.get("error") or "worker crashed", progress)
    if state == "refused":
        return Outcome("refused", progress.get("error") or "the model worker was refused", progress)
    return Outcome("crash", f"worker {_exit_text(proc.returncode)} before finishing", progress)


def _finish_nsys_coverage(progress: dict, sqlite_path: Path) -> str | None:
    """Fill ``progress``'s coverage from the Nsight Systems export; the error text on failure."""
    try:
        kernels, hosts, ranges = read_sqlite(sqlite_path)
    except (NsysError, sqlite3.Error) as exc:
        return f"--profiler nsys: {exc}"
    try:
        classifier = measured_tree().classifier()
    except ExperimentTreeError as exc:
        return str(exc)
    cov = aggregate(kernels, hosts, ranges, classifier.is_cutile)
    for line in coverage_table_lines(cov):
        print(line)
    progress["parts"]["coverage"] = coverage_block(cov, "nsys")
    return None


def _recount_coverage(progress: dict) -> str | None:
    """Classify the worker's kernel list again here: the worker runs the experiment's code, the
    supervisor only the harness's, so the stored cuTile flags and shares are this process's."""
    block = (progress.get("parts") or {}).get("coverage")
    if not isinstance(block, dict) or not isinstance(block.get("kernels"), list):
        return None
    try:
        progress["parts"]["coverage"] = recount(block, measured_tree().classifier().is_cutile)
    except ExperimentTreeError as exc:
        return str(exc)
    except (KeyError, TypeError) as exc:
        return f"the worker's coverage block is malformed: {type(exc).__name__}: {exc}"
    return None


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def build_document(
    options: BenchOptions,
    outcome: Outcome,
    commit: str,
    started_at: str,
    wall_s: float,
    fallback_env: dict,
) -> dict:
    p = outcome.progress
    return assemble(
        status=outcome.status,
        error=outcome.error,
        model_key=options.model_key,
        model_id=options.model_id,
        weights=p.get("weights") or ("pretrained" if options.model_id else "random"),
        commit=commit,
        started_at=started_at,
        wall_s=wall_s,
        env=p.get("env") or fallback_env,
        workload=options.workload.as_metrics(),
        parts=p.get("parts") or {},
        phases_s=p.get("phases_s") if isinstance(p.get("phases_s"), dict) else None,
    )


def write_metrics(path: str, doc: dict) -> None:
    write_atomic(path, doc)
