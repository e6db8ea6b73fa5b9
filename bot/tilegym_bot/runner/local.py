"""Run the benchmark as a subprocess on this host, pinned to one GPU, with a hard timeout.

The bench runs in its own session (process group), so a timeout kills everything it started,
grandchildren included: SIGTERM to the group, a grace period, then SIGKILL.

Its stdout goes through a pipe that a reader thread copies to the log file as it comes and, so
a long benchmark is never silent, echoes line by line to the terminal (stderr), each line
prefixed with the side, commit and elapsed time: ``[head 1a2b3c4d +12s] timed run 3/10: ...``.
Its stderr (warnings, tracebacks) goes to its own log file only.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TextIO

from tilegym_bot.runner.base import (
    BENCH_MODULE,
    BenchRequest,
    BenchResult,
    describe_exit,
    finish,
    head_mismatch,
    now_iso,
    prepare,
    source_path,
    with_commit,
)


def bench_env(request: BenchRequest, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the bench: the checkout's ``src/`` and the trusted harness first, only
    the requested GPU; an inherited PYTHONPATH (site packages of a GPU host) comes after them."""
    env = dict(os.environ if base is None else base)
    harness = request.harness_dir.resolve() if request.harness_dir else None
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    roots = source_path(request.repo_dir.resolve(), harness)
    env["PYTHONPATH"] = os.pathsep.join(roots + inherited)
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


# After the bench's process group is gone, how long the reader keeps draining output that is
# still arriving (only a process that escaped the group can still write).
DRAIN_S = 2.0
# An echoed "line" without a newline is cut here, so binary junk cannot grow without bound.
MAX_LINE_BYTES = 64 * 1024
_ECHO_LOCK = threading.Lock()  # whole lines, also when several executors echo at once


def _last_segment(raw: bytes) -> str:
    """The text a terminal would end up showing for one line (progress bars redraw with CR)."""
    parts = [p for p in raw.rstrip(b"\r").split(b"\r") if p.strip()]
    return parts[-1].decode("utf-8", "replace").rstrip() if parts else ""


def pump(fd: int, log: BinaryIO, on_line: Callable[[str], None] | None, done: threading.Event):
    """Copy everything readable on ``fd`` to ``log`` (flushed, byte for byte) and hand each
    complete line to ``on_line``, until EOF, or until ``done`` is set and the output stops or
    ``DRAIN_S`` has passed. Never blocks on a silent pipe, so it cannot hang the executor."""
    pending = b""
    drain_until = None
    while True:
        if done.is_set() and drain_until is None:
            drain_until = time.monotonic() + DRAIN_S
        if drain_until is not None and time.monotonic() >= drain_until:
            break
        ready, _, _ = select.select([fd], [], [], 0.1)
        if not ready:
            if drain_until is not None:
                break
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        log.write(chunk)
        log.flush()
        if on_line is None:
            continue
        pending += chunk
        *lines, pending = pending.split(b"\n")
        if len(pending) > MAX_LINE_BYTES:
            lines.append(pending)
            pending = b""
        for line in lines:
            text = _last_segment(line)
            if text:
                on_line(text)
    if on_line is not None and _last_segment(pending):
        on_line(_last_segment(pending))


class _Echo:
    """Writes prefixed lines to the terminal: ``[label +Ns] text``."""

    def __init__(self, label: str, t0: float, stream: TextIO | None):
        self.label, self.t0, self.stream = label, t0, stream

    def __call__(self, text: str) -> None:
        stream = self.stream or sys.stderr  # looked up late: follows a redirected sys.stderr
        line = f"[{self.label} +{time.monotonic() - self.t0:.0f}s] {text}\n"
        with _ECHO_LOCK, contextlib.suppress(OSError, ValueError):
            stream.write(line)
            stream.flush()


class LocalExecutor:
    """Runs the bench as a local subprocess. ``echo`` (on by default: the CLI's runs show their
    progress) copies its stdout to ``stream`` (default: stderr) as it comes, each line prefixed
    with ``label`` (e.g. ``head``), the commit and the elapsed time; the log files are written
    either way."""

    def __init__(
        self,
        python: str | None = None,
        grace_s: float = 10.0,
        *,
        echo: bool = True,
        label: str | None = None,
        stream: TextIO | None = None,
    ):
        self.python = python or sys.executable
        self.grace_s = grace_s
        self.echo = echo
        self.label = label
        self.stream = stream

    def command(self, request: BenchRequest) -> list[str]:
        return [
            self.python,
            "-m",
            BENCH_MODULE,
            *with_commit(request),
            "--metrics-out",
            str(request.metrics_out.resolve()),
        ]

    def _echo(self, request: BenchRequest, t0: float) -> _Echo | None:
        if not self.echo:
            return None
        label = f"{self.label} {request.commit[:8]}" if self.label else request.commit[:8]
        return _Echo(label, t0, self.stream)

    def run(self, request: BenchRequest) -> BenchResult:
        stdout_log, stderr_log = prepare(request)
        started_at, t0 = now_iso(), time.monotonic()
        common = dict(started_at=started_at, stdout_log=stdout_log, stderr_log=stderr_log)
        echo = self._echo(request, t0)
        mismatch = head_mismatch(request.repo_dir, request.commit)
        if mismatch:
            if echo:
                echo(f"not run: {mismatch}")
            return finish(
                request, returncode=None, timed_out=False, wall_s=0.0, error=mismatch, **common
            )
        if echo:
            echo(
                f"benchmark {' '.join(request.bench_args)} (limit {request.timeout_s:g} s); "
                f"log {stdout_log}"
            )
        with stdout_log.open("wb") as out, stderr_log.open("wb") as err:
            try:
                proc = subprocess.Popen(
                    self.command(request),
                    cwd=request.repo_dir,
                    env=bench_env(request),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
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
            done = threading.Event()
            reader = threading.Thread(
                target=pump,
                args=(proc.stdout.fileno(), out, echo, done),
                name=f"bench-stdout-{request.commit[:8]}",
                daemon=True,
            )
            reader.start()
            try:
                timed_out = not wait_unreaped(proc.pid, request.timeout_s)
                # Also after a normal exit: nothing the bench left behind may keep the GPU busy.
                kill_group(proc.pid, self.grace_s)
                proc.wait()
            finally:
                done.set()
                reader.join()
                proc.stdout.close()
        wall_s = time.monotonic() - t0
        result = finish(
            request, returncode=proc.returncode, timed_out=timed_out, wall_s=wall_s, **common
        )
        if echo:
            echo(_ending(result, timed_out, request.timeout_s, stderr_log))
        return result


def _ending(result: BenchResult, timed_out: bool, timeout_s: float, stderr_log: Path) -> str:
    """The echoed last line: how the run ended and where to look."""
    if timed_out:
        how = f"timeout: killed after the {timeout_s:g} s limit"
    else:
        how = f"{result.status} ({describe_exit(result.returncode)})"
    where = f"; stderr in {stderr_log}" if result.status != "ok" else ""
    return f"finished in {result.wall_s:.0f} s: {how}; metrics {result.metrics_path}{where}"
