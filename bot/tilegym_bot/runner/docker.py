"""Run the benchmark inside the experiment image through the Docker Engine API (docker SDK).

The container gets exactly one GPU (by UUID, never "all"), no network, a memory limit, the
checkout mounted read-only and one empty writable folder for the metrics file. A run that
outlives its limit is stopped, then killed, then removed; every container is removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Any

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

REPO_MOUNT = PurePosixPath("/workspace/repo")
OUT_MOUNT = PurePosixPath("/workspace/out")
METRICS_NAME = "metrics.json"


def git_common_dir(repo_dir: Path) -> Path | None:
    """The main repository's git dir when ``repo_dir`` is a linked worktree, else None.

    A worktree's ``.git`` is a file naming that directory by absolute path; the container
    needs it mounted at the same path for git (and so the bench's commit lookup) to work.
    """
    if not (repo_dir / ".git").is_file():
        return None
    import git

    common = git.Repo(repo_dir).git.rev_parse("--git-common-dir")
    path = Path(common)
    return (path if path.is_absolute() else repo_dir / path).resolve()


class DockerExecutor:
    def __init__(
        self,
        image: str,
        memory_limit: str = "64g",
        client: Any = None,
        grace_s: float = 10.0,
        python: str = "python3",
    ):
        self.image = image
        self.memory_limit = memory_limit
        self._client = client
        self.grace_s = grace_s
        self.python = python

    @property
    def client(self):
        if self._client is None:
            import docker

            self._client = docker.from_env()
        return self._client

    def create_kwargs(self, request: BenchRequest, out_dir: Path) -> dict[str, Any]:
        """Arguments of ``containers.create`` for one run (the whole isolation policy)."""
        from docker.types import DeviceRequest

        repo = request.repo_dir.resolve()
        volumes = {
            str(repo): {"bind": str(REPO_MOUNT), "mode": "ro"},
            str(out_dir.resolve()): {"bind": str(OUT_MOUNT), "mode": "rw"},
        }
        common = git_common_dir(repo)
        if common is not None:
            volumes[str(common)] = {"bind": str(common), "mode": "ro"}
        devices = []
        if request.gpu_uuid:
            devices = [DeviceRequest(device_ids=[request.gpu_uuid], capabilities=[["gpu"]])]
        command = [
            self.python,
            "-m",
            BENCH_MODULE,
            *with_commit(request),
            "--metrics-out",
            str(OUT_MOUNT / METRICS_NAME),
        ]
        return {
            "image": self.image,
            "command": command,
            "working_dir": str(REPO_MOUNT),
            "environment": {
                "PYTHONPATH": ":".join(source_path(REPO_MOUNT)),
                "HOME": "/tmp",
                "PYTHONUNBUFFERED": "1",
            },
            "user": f"{os.getuid()}:{os.getgid()}",
            "volumes": volumes,
            "device_requests": devices,
            "network_mode": "none",
            "mem_limit": self.memory_limit,
            "memswap_limit": self.memory_limit,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "labels": {"tilegym.commit": request.commit, "tilegym.gpu": request.gpu_uuid or ""},
            "detach": True,
        }

    def run(self, request: BenchRequest) -> BenchResult:
        from docker.errors import DockerException, ImageNotFound

        stdout_log, stderr_log = prepare(request)
        started_at, t0 = now_iso(), time.monotonic()
        common = dict(started_at=started_at, stdout_log=stdout_log, stderr_log=stderr_log)

        def refuse(error: str) -> BenchResult:
            return finish(
                request, returncode=None, timed_out=False, wall_s=0.0, error=error, **common
            )

        mismatch = head_mismatch(request.repo_dir, request.commit)
        if mismatch:
            return refuse(mismatch)
        try:
            self.client.images.get(self.image)
        except ImageNotFound:
            return refuse(
                f"image {self.image} not found; build it with `docker build -f "
                f"modeling/transformers/Dockerfile -t {self.image} .`"
            )
        except DockerException as exc:
            return refuse(f"docker is not usable: {exc}")
        out_dir = Path(tempfile.mkdtemp(prefix="docker-out-", dir=request.log_dir))
        try:
            try:
                container = self.client.containers.create(**self.create_kwargs(request, out_dir))
            except DockerException as exc:
                return refuse(f"cannot create the container: {exc}")
            returncode, timed_out, note = self._run_container(
                container, request, stdout_log, stderr_log
            )
            produced = out_dir / METRICS_NAME
            if produced.is_file():
                shutil.move(str(produced), request.metrics_out)
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)
        wall_s = time.monotonic() - t0
        return finish(
            request, returncode=returncode, timed_out=timed_out, wall_s=wall_s, note=note, **common
        )

    def _run_container(
        self, container, request: BenchRequest, stdout_log: Path, stderr_log: Path
    ) -> tuple[int | None, bool, str]:
        """Start, wait with the limit, stop/kill on timeout; always remove. (rc, timed_out, note)"""
        import requests
        from docker.errors import DockerException

        returncode, timed_out, note = None, False, ""
        try:
            container.start()
            pumps = [
                _pump_logs(container, stdout_log, stdout=True, stderr=False),
                _pump_logs(container, stderr_log, stdout=False, stderr=True),
            ]
            t0 = time.monotonic()
            try:
                returncode = int(container.wait(timeout=request.timeout_s)["StatusCode"])
            except requests.exceptions.RequestException as exc:
                if time.monotonic() - t0 < request.timeout_s * 0.99:
                    note = f"lost the container while waiting: {exc}"
                else:
                    timed_out = True
                self._stop(container)
            for pump in pumps:
                pump.join(timeout=self.grace_s)
            with contextlib.suppress(DockerException, requests.exceptions.RequestException):
                container.reload()
                if container.attrs.get("State", {}).get("OOMKilled"):
                    note = f"the container ran out of memory (limit {self.memory_limit})"
        except DockerException as exc:
            note = f"docker error: {exc}"
        finally:
            with contextlib.suppress(DockerException, requests.exceptions.RequestException):
                container.remove(force=True, v=True)
        return returncode, timed_out, note

    def _stop(self, container) -> None:
        import requests
        from docker.errors import DockerException

        with contextlib.suppress(DockerException, requests.exceptions.RequestException):
            container.stop(timeout=int(self.grace_s))
        # Stop may have failed or the daemon may not have escalated: kill; a 409 (already
        # stopped) is fine.
        with contextlib.suppress(DockerException, requests.exceptions.RequestException):
            container.kill()


def _pump_logs(container, path: Path, **which: bool) -> threading.Thread:
    """Follow one of the container's output streams into ``path`` on a background thread."""

    def pump() -> None:
        with path.open("ab") as fh, contextlib.suppress(Exception):
            for chunk in container.logs(stream=True, follow=True, **which):
                fh.write(chunk)
                fh.flush()

    thread = threading.Thread(target=pump, name=f"logs-{path.name}", daemon=True)
    thread.start()
    return thread
