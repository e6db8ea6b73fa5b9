"""One benchmark per GPU at a time, across threads and processes: a lock file per GPU UUID.

A wait is never silent and never endless: the holder writes who it is (pid, host, command,
commit, start time) into a side file next to the lock, a waiter prints one line naming it, and
gives up after a stated time (``TILEGYM_GPU_LOCK_TIMEOUT`` seconds, default 30 minutes) with a
``GpuLockTimeout`` (one ``error: ...`` line from the CLI). A run that uses no GPU (``--device
cpu``, or ``auto`` on a host without an NVIDIA GPU) takes no lock at all.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shlex
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from tilegym_bot.errors import BotError
from tilegym_bot.runner.base import BenchRequest, BenchResult, flag_value

UNPINNED = "unpinned"
TIMEOUT_ENV = "TILEGYM_GPU_LOCK_TIMEOUT"
DEFAULT_TIMEOUT_S = 1800.0
# How long a waiter gives a just-started holder to write its side file before it says "unknown".
HOLDER_GRACE_S = 1.0
COMMAND_CHARS = 200


class GpuLockTimeout(BotError):
    """Gave up waiting for a GPU lock; nothing was run."""


def default_lock_dir() -> Path:
    """Shared by every runner on the host unless ``TILEGYM_GPU_LOCK_DIR`` says otherwise."""
    return Path(
        os.environ.get("TILEGYM_GPU_LOCK_DIR") or Path(tempfile.gettempdir()) / "tilegym-gpu-locks"
    )


def lock_path(lock_dir: Path, gpu_uuid: str) -> Path:
    return lock_dir / (re.sub(r"[^A-Za-z0-9._-]", "_", gpu_uuid) + ".lock")


def holder_path(lock: Path) -> Path:
    """The side file where the lock's holder says who it is."""
    return lock.with_name(lock.name + ".holder")


def lock_timeout(timeout: float | None = None) -> float:
    """Seconds to wait for a lock: ``timeout`` when given, else ``$TILEGYM_GPU_LOCK_TIMEOUT``,
    else 30 minutes; ``inf`` waits forever."""
    if timeout is not None:
        return max(float(timeout), 0.0)
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise BotError(
            f"{TIMEOUT_ENV} must be a number of seconds >= 0 (inf: wait forever), got {raw!r}"
        )
    return value


def host_has_nvidia_gpu(env: dict[str, str] | None = None) -> bool:
    """Whether a CUDA program started here could see an NVIDIA GPU (driver device nodes present
    and not hidden by an empty ``CUDA_VISIBLE_DEVICES``). Cheap: no CUDA library is loaded."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    gpus = Path("/proc/driver/nvidia/gpus")
    return any(Path("/dev").glob("nvidia[0-9]*")) or (gpus.is_dir() and any(gpus.iterdir()))


def needs_gpu_lock(bench_args: list[str], gpu_uuid: str | None = None) -> bool:
    """Whether a benchmark with these arguments runs on a GPU and so must hold its lock:
    ``--device cpu`` never does; ``cuda``/``cuda:N`` or a pinned GPU always does; ``auto`` (the
    default) does when the host has an NVIDIA GPU."""
    device = flag_value(bench_args, "--device") or "auto"
    if device == "cpu":
        return False
    if device.startswith("cuda") or gpu_uuid:
        return True
    return host_has_nvidia_gpu()


def _command_line() -> str:
    argv = [Path(sys.argv[0]).name if sys.argv else "python", *sys.argv[1:]]
    text = shlex.join(argv)
    return text if len(text) <= COMMAND_CHARS else text[: COMMAND_CHARS - 3] + "..."


def _write_holder(path: Path, info: dict[str, Any]) -> None:
    """Best effort, in place (another user's side file in a sticky /tmp folder cannot be
    replaced, only rewritten): the waiter's message is a courtesy, never a reason to fail."""
    data = json.dumps(info).encode()
    with contextlib.suppress(OSError):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        except FileNotFoundError:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            with contextlib.suppress(OSError):
                os.fchmod(fd, 0o666)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)


def _clear_holder(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_TRUNC))


def read_holder(lock: Path) -> dict[str, Any] | None:
    """What the lock's holder wrote about itself, or None (not written yet, released, garbled)."""
    try:
        info = json.loads(holder_path(lock).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def describe_holder(info: dict[str, Any] | None) -> str:
    """``pid N (host H, `command`, commit C) since T`` from a side file, as far as it says."""
    if not info:
        return "a process that has not said who it is"
    details = [f"host {info['host']}"] if info.get("host") else []
    if info.get("command"):
        details.append(f"`{info['command']}`")
    if info.get("commit"):
        details.append(f"commit {str(info['commit'])[:8]}")
    text = f"pid {info.get('pid', '?')}" + (f" ({', '.join(details)})" if details else "")
    return text + (f" since {info['started_at']}" if info.get("started_at") else "")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _acquired(lock: FileLock, timeout: float) -> bool:
    try:
        lock.acquire(timeout=-1 if math.isinf(timeout) else timeout)
    except Timeout:
        return False
    return True


def _acquire(lock: FileLock, path: Path, limit: float, announce: Callable[[str], None]) -> None:
    """Take the lock at once, or say once whose it is, wait up to ``limit`` s, then give up."""
    if _acquired(lock, 0):
        return
    start = time.monotonic()
    info = read_holder(path)
    while info is None and time.monotonic() - start < min(HOLDER_GRACE_S, limit):
        if _acquired(lock, 0.1):
            return
        info = read_holder(path)
    bound = "waiting without limit" if math.isinf(limit) else f"giving up after {limit:g} s"
    announce(
        f"waiting for the GPU lock {path} held by {describe_holder(info)}; {bound} ({TIMEOUT_ENV})"
    )
    if _acquired(lock, max(limit - (time.monotonic() - start), 0.0)):
        return
    raise GpuLockTimeout(
        f"gave up after {limit:g} s waiting for the GPU lock {path}, still held by "
        f"{describe_holder(read_holder(path) or info)}: let it finish or stop it, or set "
        f"{TIMEOUT_ENV} (seconds) to wait longer; nothing was run"
    )


@contextmanager
def gpu_lock(
    gpu_uuid: str,
    lock_dir: Path | None = None,
    timeout: float | None = None,
    *,
    holder: dict[str, Any] | None = None,
    announce: Callable[[str], None] = _say,
) -> Iterator[Path]:
    """Hold the GPU's lock, waiting at most ``timeout`` s (see ``lock_timeout``); ``holder``
    (e.g. the commit) goes into the side file with the pid, host, command and start time."""
    limit = lock_timeout(timeout)
    directory = lock_dir or default_lock_dir()
    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        # Shared by every user that runs benchmarks on this host, like /tmp itself.
        with contextlib.suppress(PermissionError):
            directory.chmod(0o1777)
    path = lock_path(directory, gpu_uuid)
    lock = FileLock(path, mode=0o666)
    _acquire(lock, path, limit, announce)
    try:
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": _command_line(),
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            **(holder or {}),
        }
        _write_holder(holder_path(path), info)
        yield path
    finally:
        _clear_holder(holder_path(path))
        lock.release()


class GpuLockedExecutor:
    """Wraps an executor so that its runs on one GPU never overlap (no UUID: one shared lock).
    A run that uses no GPU (``needs_gpu_lock``) goes straight through."""

    def __init__(self, inner, lock_dir: Path | None = None, timeout: float | None = None):
        self.inner = inner
        self.lock_dir = lock_dir
        self.timeout = timeout

    def run(self, request: BenchRequest) -> BenchResult:
        if not needs_gpu_lock(request.bench_args, request.gpu_uuid):
            return self.inner.run(request)
        holder = {"commit": request.commit}
        with gpu_lock(request.gpu_uuid or UNPINNED, self.lock_dir, self.timeout, holder=holder):
            return self.inner.run(request)
