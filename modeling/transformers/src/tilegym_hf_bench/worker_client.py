"""The model worker process seen from the trusted side: start it, send requests, stop it
(SIGSTOP while this process's side is timed), read its refusals. Torch-free, so the measuring
process can start the worker before it imports torch itself (``worker.main``): the worker's
imports, CUDA context and model build then run beside the measuring process's own."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tilegym_hf_bench.errors import BenchError
from tilegym_hf_bench.isolation.audit_hook import REFUSED_EXIT, read_refusals
from tilegym_hf_bench.worker_wire import Reader, WireError, send

#: Toolchains the worker's compilers run as subprocesses (cuTile's tileiras and ptxas,
#: Triton's ptxas and its launcher build, Inductor's C++ build on a CPU; ``nvcc`` and ``file``
#: were seen in an honest qwen3 static run on the H200 in record-only mode).
TOOLCHAIN_PROGRAMS = (
    "tileiras",
    "ptxas",
    "nvdisasm",
    "cuobjdump",
    "nvcc",
    "file",
    "gcc",
    "cc",
    "g++",
    "c++",
    "ldconfig",
)
WORKER_CACHE_ROOT = Path("~/.cache/tilegym/worker").expanduser()
CALL_TIMEOUT_S = 24 * 3600.0  # the supervisor's time limit is what ends a hung worker


class WorkerRefused(BenchError):
    """The worker did something its confinement refuses; the run's status is ``refused``."""


def tree_key(src_root: Path) -> str:
    """A key for the measured tree's code: its compile caches are its own, so one tree cannot
    leave compiled artifacts that another tree's run would load."""
    digest = hashlib.sha256()
    for path in sorted(src_root.rglob("*.py")):
        digest.update(str(path.relative_to(src_root)).encode())
        try:
            digest.update(path.read_bytes())
        except OSError:
            continue
    return digest.hexdigest()[:20]


def _wait_stopped(pid: int, limit_s: float = 2.0) -> None:
    """Return once ``pid`` is stopped (a signal is delivered asynchronously: the process may
    run on for a moment after ``kill``); its state from /proc, where there is one."""
    stat = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            time.sleep(0.01)  # no /proc (or the process is gone): a delivery's worth of time
            return
        if state in ("T", "t", "Z", "X"):
            return
        time.sleep(0.0005)
    raise BenchError(f"the model worker (pid {pid}) did not stop within {limit_s:.0f} s")


def _exit_text(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exited with code {code}"


class ModelWorker:
    """One worker process: start, requests, refusals, end."""

    def __init__(self, *, device: str, scratch: Path, src_root: Path, log):
        self.scratch = scratch
        self.log = log
        caches = WORKER_CACHE_ROOT / tree_key(src_root)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.environ.get("TILEGYM_WORKER_PYTHONPATH", env.get("PYTHONPATH", ""))
        for var, sub in (
            ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
            ("TRITON_CACHE_DIR", "triton"),
            ("CUDA_TILE_CACHE_DIR", "cutile"),
            ("XDG_CACHE_HOME", "xdg"),
        ):
            env[var] = str(caches / sub)
            (caches / sub).mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(scratch)
        env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # no compile-worker pool of processes
        env["TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"] = "0"  # else Inductor runs openssl
        env["PYTHONUNBUFFERED"] = "1"
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        self.refusal_log = scratch / "refusals.log"
        config = {
            "in_fd": to_worker_r,
            "out_fd": from_worker_w,
            "scratch": str(scratch),
            "device": device,
            "confinement": {
                "experiment_roots": [str(src_root / "tilegym")],
                "owned_modules": ["tilegym"],
                "writable": [str(scratch), str(caches)],
                "allowed_executables": list(TOOLCHAIN_PROGRAMS),
                "record_only": os.environ.get("TILEGYM_WORKER_AUDIT") == "record",
                "refusal_log": str(self.refusal_log),
            },
        }
        config_path = scratch / "worker-config.json"
        config_path.write_text(json.dumps(config))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tilegym_hf_bench.model_worker", str(config_path)],
            pass_fds=(to_worker_r, from_worker_w),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        os.close(to_worker_r)
        os.close(from_worker_w)
        self._out = to_worker_w
        self._reader = Reader(from_worker_r)
        self._relay = threading.Thread(target=self._relay_output, daemon=True)
        self._relay.start()
        self._calls = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model-worker")
        self._pending: list[Future] = []
        self._closed = False
        log(f"model worker: pid {self.proc.pid} (the only process that imports {src_root})")

    def _relay_output(self) -> None:
        """The worker's own output, marked as such: it cannot print lines that read as ours."""
        for raw in self.proc.stdout:
            print("[worker] " + raw.decode("utf-8", "replace").rstrip("\n"), flush=True)

    def refusals(self) -> list[str]:
        """What the confinement refused (``refused: ...``); in record-only mode
        (``TILEGYM_WORKER_AUDIT=record``) its ``would refuse: ...`` lines are logged at the end
        instead, and refuse nothing."""
        return [line for line in read_refusals(self.refusal_log) if line.startswith("refused")]

    def _dead(self, why: str) -> BenchError:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._relay.join(timeout=5)
        refused = self.refusals()
        if refused:
            return WorkerRefused(f"the model worker was refused: {refused[0]}")
        if code == REFUSED_EXIT:  # its log's descriptor is in the worker's reach; its exit is not
            return WorkerRefused("the model worker was refused (its refusal log is empty)")
        return BenchError(f"the model worker {_exit_text(code)} ({why})")

    def submit(self, message: dict) -> Future:
        """Send ``message`` without waiting: its reply is the future's result, the requests
        answered in order by one thread. The worker starts and compiles while this process
        compiles its own side; each reply carries ``_elapsed_s``, the seconds from sending it
        to reading its answer, measured here."""
        future = self._calls.submit(self._call, message, CALL_TIMEOUT_S)
        self._pending = [f for f in self._pending if not f.done()] + [future]
        return future

    def drain(self) -> None:
        """Wait until every request sent ahead is answered (their results and errors stay with
        their futures): a call timed after this one waits for nothing queued before it."""
        wait_all(self._pending)
        self._pending = []

    def call(self, message: dict, timeout_s: float = CALL_TIMEOUT_S) -> dict:
        return self._calls.submit(self._call, message, timeout_s).result()

    @contextmanager
    def frozen(self):
        """The worker stopped (SIGSTOP) for the body: while the PyTorch side is timed no thread
        of the worker can launch GPU work or burn the CPU the clock shares; GPU work it queued
        before is what ``gpu_activity`` looks for."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        try:
            _wait_stopped(self.proc.pid)
            yield
        finally:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGCONT)

    def _call(self, message: dict, timeout_s: float) -> dict:
        start = time.perf_counter()
        try:
            send(self._out, message)
            reply = self._reader.recv(timeout_s)
        except (WireError, BrokenPipeError) as exc:
            raise self._dead(str(exc)) from None
        reply["_elapsed_s"] = time.perf_counter() - start
        refused = self.refusals()
        if refused:
            raise WorkerRefused(f"the model worker was refused: {refused[0]}")
        if isinstance(reply.get("refused"), str):
            raise WorkerRefused(f"the model worker was refused: {reply['refused']}")
        if reply.get("ok") is not True:
            error = reply.get("error")
            raise BenchError(f"cuTile side: {error if isinstance(error, str) else reply!r}")
        return reply

    def close(self, grace_s: float = 10.0) -> None:
        """Ask the worker to exit, kill it after ``grace_s`` (0: at once, a worker the run does
        not need); a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        for line in read_refusals(self.refusal_log):
            if line.startswith("would refuse"):
                self.log(f"audit (record only): {line}")
        if self.proc.poll() is None and grace_s > 0:
            try:
                send(self._out, {"op": "exit"})
                self.proc.wait(timeout=grace_s)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._calls.shutdown(wait=True, cancel_futures=True)
        os.close(self._out)
        os.close(self._reader.fd)
        self._relay.join(timeout=5)


@dataclass(frozen=True)
class StartedWorker:
    """A model worker started with the run, and the future of its ``init`` answer."""

    worker: ModelWorker
    init: Future


def cutile_unmeasured_reason(options, tree) -> str | None:
    """Why the cuTile side is not measured at all (None: it is), known before any model."""
    if options.skip_cutile:
        return "--skip-cutile"
    if tree.package_dir is None:
        return "no tilegym package in the measured tree"
    return None


def start_model_worker(options, tree, scratch: Path, log) -> StartedWorker | None:
    """Start the worker and send its ``init`` (build the model from the run's seed, patch it
    with the measured tree's flags) before this process imports torch: what the worker needs
    is in the options and the tree's data files. None when the cuTile side is not measured."""
    if cutile_unmeasured_reason(options, tree) is not None:
        return None
    table = tree.patch_table()
    worker = ModelWorker(
        device=options.device, scratch=scratch, src_root=tree.package_dir.parent, log=log
    )
    init = worker.submit(
        {
            "op": "init",
            "model_key": options.model_key,
            "model_id": options.model_id,
            "seed": options.workload.seed,
            "patch_table": table,
        }
    )
    return StartedWorker(worker, init)
