"""A folder of queued benchmark requests served by one worker per GPU.

Layout of the queue folder: pending requests are ``*.json`` at the top, taken in name order;
a worker claims one by renaming it into ``running/`` (atomic: two workers never get the same
file), runs it on its GPU under that GPU's lock, and writes the request plus its result to
``done/``. A request that cannot be parsed goes to ``failed/`` with a ``.error`` line beside it.

A request file::

    {"repo_dir": "/path/checkout", "commit": "<40 hex>", "bench_args": ["--model-key", "qwen3"],
     "metrics_out": "/path/head.json", "log_dir": "/path/logs", "timeout_s": 900}

Relative paths are taken relative to the queue folder. The GPU is the worker's, never the file's.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tilegym_bot.runner.base import BenchRequest, BenchResult, now_iso, write_json_atomic
from tilegym_bot.runner.gpulock import GpuLockedExecutor, GpuLockTimeout

REQUIRED = {"repo_dir", "commit", "bench_args", "metrics_out", "log_dir"}
OPTIONAL = {"timeout_s"}
SHA_RE = re.compile(r"^[0-9a-f]{40}$")


class RequestError(ValueError):
    """A queued request file that cannot be run; the message says why."""


def parse_request(doc: Any, base_dir: Path) -> BenchRequest:
    """Build a request from a queued JSON document, or raise RequestError. Pure."""
    if not isinstance(doc, dict):
        raise RequestError("a request must be a JSON object")
    missing = sorted(REQUIRED - doc.keys())
    unknown = sorted(doc.keys() - REQUIRED - OPTIONAL)
    if missing:
        raise RequestError(f"missing keys: {', '.join(missing)}")
    if unknown:
        raise RequestError(f"unknown keys: {', '.join(unknown)}")
    if not isinstance(doc["commit"], str) or not SHA_RE.match(doc["commit"]):
        raise RequestError("commit must be 40 lowercase hex digits")
    args = doc["bench_args"]
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise RequestError("bench_args must be a list of strings")
    for key in ("repo_dir", "metrics_out", "log_dir"):
        if not isinstance(doc[key], str) or not doc[key]:
            raise RequestError(f"{key} must be a non-empty path string")
    timeout = doc.get("timeout_s", 900.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise RequestError("timeout_s must be a positive number")
    return BenchRequest(
        repo_dir=base_dir / doc["repo_dir"],
        commit=doc["commit"],
        bench_args=list(args),
        metrics_out=base_dir / doc["metrics_out"],
        log_dir=base_dir / doc["log_dir"],
        timeout_s=float(timeout),
    )


def pending(queue_dir: Path) -> list[Path]:
    return sorted(p for p in queue_dir.glob("*.json") if p.is_file())


def claim_next(queue_dir: Path) -> Path | None:
    """Move the first pending request into ``running/``; None when the queue is empty."""
    running = queue_dir / "running"
    running.mkdir(exist_ok=True)
    for path in pending(queue_dir):
        target = running / path.name
        try:
            os.rename(path, target)
        except FileNotFoundError:  # another worker took it first
            continue
        return target
    return None


def _record(request: BenchRequest, result: BenchResult) -> dict[str, Any]:
    req = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(request).items()}
    res = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(result).items()}
    return {"request": req, "result": res, "finished_at": now_iso()}


def process(claimed: Path, executor, gpu_uuid: str, queue_dir: Path) -> BenchResult | None:
    """Run one claimed request on ``gpu_uuid``; None when the file was not a valid request or
    the GPU's lock could not be had in time (the request is then back in the queue)."""
    try:
        request = parse_request(json.loads(claimed.read_text()), queue_dir)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RequestError) as exc:
        failed = queue_dir / "failed"
        failed.mkdir(exist_ok=True)
        os.replace(claimed, failed / claimed.name)
        message = f"{failed / claimed.name}:1: QUEUE001 {exc}"
        (failed / f"{claimed.name}.error").write_text(message + "\n")
        print(message, flush=True)
        return None
    request.gpu_uuid = gpu_uuid
    try:
        result = executor.run(request)
    except GpuLockTimeout as exc:
        # nothing ran: the request goes back to the queue for the next free moment
        os.replace(claimed, queue_dir / claimed.name)
        print(f"runner: {claimed.name} on {gpu_uuid}: requeued: {exc}", flush=True)
        return None
    write_json_atomic(queue_dir / "done" / claimed.name, _record(request, result))
    claimed.unlink(missing_ok=True)
    print(
        f"runner: {claimed.name} on {gpu_uuid}: {result.status} ({result.wall_s:.1f} s)",
        flush=True,
    )
    return result


def worker(
    queue_dir: Path,
    gpu_uuid: str,
    executor,
    stop: threading.Event,
    once: bool,
    poll_s: float,
) -> None:
    while not stop.is_set():
        claimed = claim_next(queue_dir)
        if claimed is None:
            if once:
                return
            stop.wait(poll_s)
            continue
        process(claimed, executor, gpu_uuid, queue_dir)


def serve(
    queue_dir: Path,
    gpus: list[str],
    make_executor: Callable[[], Any],
    *,
    once: bool = False,
    poll_s: float = 5.0,
    lock_dir: Path | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Serve the queue with one worker thread per GPU until drained (``once``) or stopped."""
    queue_dir.mkdir(parents=True, exist_ok=True)
    stop = stop or threading.Event()
    threads = [
        threading.Thread(
            target=worker,
            args=(
                queue_dir,
                uuid,
                GpuLockedExecutor(make_executor(), lock_dir),
                stop,
                once,
                poll_s,
            ),
            name=f"gpu-{uuid}",
        )
        for uuid in gpus
    ]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.5)
    except KeyboardInterrupt:
        stop.set()
        for thread in threads:
            thread.join()
    return 0
