"""Run the benchmark inside the experiment image through the Docker Engine API (docker SDK).

The container gets exactly one GPU (by UUID, never "all"), no network, a memory limit, a limit
on its number of processes, the CPU set of its GPU (two runs on one host must not share cores:
their host-bound timings would disturb each other), the checkout mounted read-only, the trusted
harness (when given) read-only beside it, and one empty writable folder for the metrics file.
What a run writes is capped: the output folder is watched while the container runs (the run is
killed when it grows past its cap) and each log stream stops being saved past its cap. A run
that outlives its limit is stopped, then killed, then removed; every container is removed.

Containers carry the labels ``tilegym.bench`` and ``tilegym.gpu`` (the GPU lock the run holds:
its UUID, ``unpinned``, or ``none`` for a run without a GPU, which takes no lock). A run that
holds a lock starts by removing the containers labelled with that lock: the caller holds it
(``GpuLockedExecutor``), so any such container is stale, left by a runner that was killed, and
may still be using the GPU. Runs without a GPU run side by side and remove nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
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
from tilegym_bot.runner.gpulock import UNPINNED, needs_gpu_lock

REPO_MOUNT = PurePosixPath("/workspace/repo")
HARNESS_MOUNT = PurePosixPath("/workspace/harness")
OUT_MOUNT = PurePosixPath("/workspace/out")
METRICS_NAME = "metrics.json"
BENCH_LABEL = "tilegym.bench"
GPU_LABEL = "tilegym.gpu"
NO_LOCK = "none"
DEFAULT_PIDS_LIMIT = 4096
DEFAULT_OUT_BYTES = 64 * 1024 * 1024
DEFAULT_LOG_BYTES = 64 * 1024 * 1024
SIGKILL_STATUS = 137
OOM_EVENT_WAIT_S = 3.0
"""How long after a SIGKILL exit the engine's ``oom`` event is looked for."""
WATCH_INTERVAL_S = 0.2
#: how long one engine API call may take: docker-py's default of 60 s is too short for
#: ``containers/create`` on an engine whose storage driver copies the image per container (vfs),
#: which took longer on a loaded 2-core host; the run's own limit is ``timeout_s``
API_TIMEOUT_S = 300
_CPU_LIST = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")
ANY_GPU = ""


def parse_cpusets(spec: str | None) -> dict[str, str]:
    """``0-15`` (every GPU) or ``GPU-a=0-15;GPU-b=16-31`` (per GPU) → {gpu or "": cpu list}.

    ValueError names what is wrong. Pure.
    """
    if spec is None or not spec.strip():
        return {}
    text = spec.strip()
    if "=" not in text:
        if not _CPU_LIST.fullmatch(text):
            raise ValueError(f"CPU set {text!r} is not a list like 0-7 or 0,2,4-7")
        return {ANY_GPU: text}
    found: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        gpu, _, cpus = (x.strip() for x in part.partition("="))
        if not gpu or not _CPU_LIST.fullmatch(cpus):
            raise ValueError(f"CPU set entry {part!r} is not GPU-UUID=CPU-LIST (e.g. GPU-a=0-7)")
        if gpu in found:
            raise ValueError(f"CPU set names {gpu} twice")
        found[gpu] = cpus
    return found


def gpu_label(request: BenchRequest) -> str:
    """The GPU lock ``GpuLockedExecutor`` takes for ``request`` (``none``: it takes none)."""
    if not needs_gpu_lock(request.bench_args, request.gpu_uuid):
        return NO_LOCK
    return request.gpu_uuid or UNPINNED


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
        *,
        pids_limit: int = DEFAULT_PIDS_LIMIT,
        cpusets: dict[str, str] | None = None,
        out_bytes: int = DEFAULT_OUT_BYTES,
        log_bytes: int = DEFAULT_LOG_BYTES,
    ):
        self.image = image
        self.memory_limit = memory_limit
        self._client = client
        self.grace_s = grace_s
        self.python = python
        self.pids_limit = pids_limit
        self.cpusets = dict(cpusets or {})
        self.out_bytes = out_bytes
        self.log_bytes = log_bytes

    def cpuset(self, request: BenchRequest) -> str | None:
        """The CPUs of the request's GPU (or of every GPU), None when not configured."""
        return self.cpusets.get(request.gpu_uuid or ANY_GPU, self.cpusets.get(ANY_GPU))

    @property
    def client(self):
        if self._client is None:
            import docker

            self._client = docker.from_env(timeout=API_TIMEOUT_S)
        return self._client

    def create_kwargs(self, request: BenchRequest, out_dir: Path) -> dict[str, Any]:
        """Arguments of ``containers.create`` for one run (the whole isolation policy)."""
        from docker.types import DeviceRequest

        repo = request.repo_dir.resolve()
        volumes = {
            str(repo): {"bind": str(REPO_MOUNT), "mode": "ro"},
            str(out_dir.resolve()): {"bind": str(OUT_MOUNT), "mode": "rw"},
        }
        harness = None
        if request.harness_dir is not None:
            volumes[str(request.harness_dir.resolve())] = {"bind": str(HARNESS_MOUNT), "mode": "ro"}
            harness = HARNESS_MOUNT
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
        limits: dict[str, Any] = {"pids_limit": self.pids_limit}
        cpus = self.cpuset(request)
        if cpus:
            limits["cpuset_cpus"] = cpus
        return {
            "image": self.image,
            "command": command,
            "working_dir": str(REPO_MOUNT),
            "environment": {
                "PYTHONPATH": ":".join(source_path(REPO_MOUNT, harness)),
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
            **limits,
            "labels": {
                BENCH_LABEL: "1",
                GPU_LABEL: gpu_label(request),
                "tilegym.commit": request.commit,
            },
            "detach": True,
        }

    def sweep(self, request: BenchRequest) -> list[str]:
        """Remove every container labelled with this request's GPU (see module doc); their ids."""
        from docker.errors import NotFound

        lock = gpu_label(request)
        if lock == NO_LOCK:
            return []
        filters = {"label": [f"{BENCH_LABEL}=1", f"{GPU_LABEL}={lock}"]}
        removed = []
        for container in self.client.containers.list(all=True, sparse=True, filters=filters):
            with contextlib.suppress(NotFound):  # it went away by itself meanwhile
                container.remove(force=True, v=True)
                removed.append(container.id)
        return removed

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
        try:
            stale = self.sweep(request)
        except DockerException as exc:
            return refuse(f"cannot remove stale benchmark containers: {exc}")
        if stale:
            with stderr_log.open("a", encoding="utf-8") as fh:
                for cid in stale:
                    print(
                        f"[runner] removed stale container {cid[:12]} of {gpu_label(request)}",
                        file=fh,
                    )
        out_dir = Path(tempfile.mkdtemp(prefix="docker-out-", dir=request.log_dir))
        try:
            try:
                container = self.client.containers.create(**self.create_kwargs(request, out_dir))
            except DockerException as exc:
                return refuse(f"cannot create the container: {exc}")
            returncode, timed_out, note = self._run_container(
                container, request, stdout_log, stderr_log, out_dir
            )
            produced = out_dir / METRICS_NAME
            written = folder_bytes(out_dir)
            if written > self.out_bytes:
                note = note or f"it wrote {written} bytes, more than the {self.out_bytes} allowed"
            elif produced.is_file() and not produced.is_symlink():
                shutil.move(str(produced), request.metrics_out)
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)
        wall_s = time.monotonic() - t0
        return finish(
            request, returncode=returncode, timed_out=timed_out, wall_s=wall_s, note=note, **common
        )

    def _run_container(
        self, container, request: BenchRequest, stdout_log: Path, stderr_log: Path, out_dir: Path
    ) -> tuple[int | None, bool, str]:
        """Start, wait with the limit, stop/kill on timeout; always remove. (rc, timed_out, note)"""
        import requests
        from docker.errors import DockerException

        returncode, timed_out, note = None, False, ""
        since = int(time.time()) - 1
        try:
            container.start()
            pumps = [
                _pump_logs(container, stdout_log, self.log_bytes, stdout=True, stderr=False),
                _pump_logs(container, stderr_log, self.log_bytes, stdout=False, stderr=True),
            ]
            done = threading.Event()
            flooded = _watch_output(container, out_dir, self.out_bytes, done)
            t0 = time.monotonic()
            try:
                returncode = int(container.wait(timeout=request.timeout_s)["StatusCode"])
            except requests.exceptions.RequestException as exc:
                if time.monotonic() - t0 < request.timeout_s * 0.99:
                    note = f"lost the container while waiting: {exc}"
                else:
                    timed_out = True
                self._stop(container)
            done.set()
            if flooded.is_set():
                note = (
                    f"it wrote more than {self.out_bytes} bytes into its output folder "
                    "and was killed"
                )
            for pump in pumps:
                pump.join(timeout=self.grace_s)
            with contextlib.suppress(DockerException, requests.exceptions.RequestException):
                container.reload()
                killed = returncode == SIGKILL_STATUS and not (timed_out or note)
                if container.attrs.get("State", {}).get("OOMKilled") or (
                    killed and self._oom_reported(container.id, since)
                ):
                    note = f"the container ran out of memory (limit {self.memory_limit})"
        except DockerException as exc:
            note = f"docker error: {exc}"
        finally:
            with contextlib.suppress(DockerException, requests.exceptions.RequestException):
                container.remove(force=True, v=True)
        return returncode, timed_out, note

    def _oom_reported(self, container_id: str, since: int) -> bool:
        """Whether the engine logged an ``oom`` event for the container since ``since``: a
        SIGKILL nobody here sent. dockerd sets ``State.OOMKilled`` only when the kernel's OOM
        notice reaches it before the exit does; the event is logged either way. Looked for
        until ``OOM_EVENT_WAIT_S`` after the exit, for a notice that comes late."""
        deadline = time.monotonic() + OOM_EVENT_WAIT_S
        filters = {"container": [container_id], "event": ["oom"]}
        while True:
            until = int(time.time()) + 1
            events = self.client.events(since=since, until=until, filters=filters, decode=True)
            if any(e.get("Action", e.get("status")) == "oom" for e in events):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    def _stop(self, container) -> None:
        import requests
        from docker.errors import DockerException

        with contextlib.suppress(DockerException, requests.exceptions.RequestException):
            container.stop(timeout=int(self.grace_s))
        # Stop may have failed or the daemon may not have escalated: kill; a 409 (already
        # stopped) is fine.
        with contextlib.suppress(DockerException, requests.exceptions.RequestException):
            container.kill()


def folder_bytes(folder: Path) -> int:
    """Bytes of every file under ``folder`` (links not followed; vanishing files skipped)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _watch_output(container, folder: Path, cap: int, done: threading.Event) -> threading.Event:
    """Kill the container when ``folder`` grows past ``cap`` bytes; the returned event is set
    when that happened. Stops when ``done`` is set."""
    flooded = threading.Event()

    def watch() -> None:
        while not done.wait(WATCH_INTERVAL_S):
            if folder_bytes(folder) > cap:
                flooded.set()
                with contextlib.suppress(Exception):
                    container.kill()
                return

    threading.Thread(target=watch, name="watch-out", daemon=True).start()
    return flooded


def _pump_logs(container, path: Path, cap: int, **which: bool) -> threading.Thread:
    """Follow one of the container's output streams into ``path`` on a background thread; past
    ``cap`` bytes the rest is read and dropped (one line says so)."""

    def pump() -> None:
        written = 0
        with path.open("ab") as fh, contextlib.suppress(Exception):
            for chunk in container.logs(stream=True, follow=True, **which):
                if written >= cap:
                    continue
                keep = chunk[: cap - written]
                fh.write(keep)
                written += len(keep)
                if written >= cap:
                    fh.write(f"\n[runner] log cut at {cap} bytes\n".encode())
                fh.flush()

    thread = threading.Thread(target=pump, name=f"logs-{path.name}", daemon=True)
    thread.start()
    return thread
