"""Run the benchmark as a subprocess on this host, pinned to one GPU, with a hard timeout.

The bench runs in its own session (process group), so a timeout kills everything it started,
grandchildren included: SIGTERM to the group, a grace period, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from tilegym_bot.runner.base import (
    BENCH_MODULE,
    BenchRequest,
    BenchResult,
    finish,
    head_mismatch,
    now_iso,
    prepare,
    source_path,
    with_commit,
)


def bench_env(request: BenchRequest, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the bench: the checkout's code first, only the requested GPU."""
    env = dict(os.environ if base is None else base)
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(source_path(request.repo_dir.resolve()) + inherited)
    if request.gpu_uuid:
        env["CUDA_VISIBLE_DEVICES"] = request.gpu_uuid
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def wait_unreaped(pid: int, timeout: float | None) -> bool:
    """Wait up to ``timeout`` s for ``pid`` to exit; True when it has.

    The process is left unreaped (a zombie), so its process-group id cannot be reused by an
    unrelated process before the group is killed.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def kill_group(pgid: int, grace_s: float) -> None:
    """SIGTERM the group, give its leader ``grace_s`` to exit, then SIGKILL whatever is left."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    wait_unreaped(pgid, grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


class LocalExecutor:
    def __init__(self, python: str | None = None, grace_s: float = 10.0):
        self.python = python or sys.executable
        self.grace_s = grace_s

    def command(self, request: BenchRequest) -> list[str]:
        return [
            self.python,
            "-m",
            BENCH_MODULE,
            *with_commit(request),
            "--metrics-out",
            str(request.metrics_out.resolve()),
        ]

    def run(self, request: BenchRequest) -> BenchResult:
        stdout_log, stderr_log = prepare(request)
        started_at, t0 = now_iso(), time.monotonic()
        common = dict(started_at=started_at, stdout_log=stdout_log, stderr_log=stderr_log)
        mismatch = head_mismatch(request.repo_dir, request.commit)
        if mismatch:
            return finish(
                request, returncode=None, timed_out=False, wall_s=0.0, error=mismatch, **common
            )
        with stdout_log.open("wb") as out, stderr_log.open("wb") as err:
            try:
                proc = subprocess.Popen(
                    self.command(request),
                    cwd=request.repo_dir,
                    env=bench_env(request),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
            except OSError as exc:
                return finish(
                    request,
                    returncode=None,
                    timed_out=False,
                    wall_s=0.0,
                    error=f"cannot start {self.python}: {exc}",
                    **common,
                )
            timed_out = not wait_unreaped(proc.pid, request.timeout_s)
            # Also after a normal exit: nothing the bench left behind may keep the GPU busy.
            kill_group(proc.pid, self.grace_s)
            proc.wait()
        wall_s = time.monotonic() - t0
        return finish(
            request, returncode=proc.returncode, timed_out=timed_out, wall_s=wall_s, **common
        )
