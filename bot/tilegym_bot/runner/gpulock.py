"""One benchmark per GPU at a time, across threads and processes: a lock file per GPU UUID."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock

from tilegym_bot.runner.base import BenchRequest, BenchResult

UNPINNED = "unpinned"


def default_lock_dir() -> Path:
    """Shared by every runner on the host unless ``TILEGYM_GPU_LOCK_DIR`` says otherwise."""
    return Path(
        os.environ.get("TILEGYM_GPU_LOCK_DIR") or Path(tempfile.gettempdir()) / "tilegym-gpu-locks"
    )


def lock_path(lock_dir: Path, gpu_uuid: str) -> Path:
    return lock_dir / (re.sub(r"[^A-Za-z0-9._-]", "_", gpu_uuid) + ".lock")


@contextmanager
def gpu_lock(gpu_uuid: str, lock_dir: Path | None = None, timeout: float = -1) -> Iterator[None]:
    """Hold the GPU's lock (waiting ``timeout`` s, forever when negative)."""
    directory = lock_dir or default_lock_dir()
    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        # Shared by every user that runs benchmarks on this host, like /tmp itself.
        with contextlib.suppress(PermissionError):
            directory.chmod(0o1777)
    with FileLock(lock_path(directory, gpu_uuid), timeout=timeout, mode=0o666):
        yield


class GpuLockedExecutor:
    """Wraps an executor so that its runs on one GPU never overlap (no UUID: one shared lock)."""

    def __init__(self, inner, lock_dir: Path | None = None):
        self.inner = inner
        self.lock_dir = lock_dir

    def run(self, request: BenchRequest) -> BenchResult:
        with gpu_lock(request.gpu_uuid or UNPINNED, self.lock_dir):
            return self.inner.run(request)
