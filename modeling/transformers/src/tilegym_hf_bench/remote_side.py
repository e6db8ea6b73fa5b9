"""The cuTile side as the trusted process sees it: a model worker in its own process, driven
over the wire (``model_worker``), timed here.

A timed call is: the prompt this process drew a moment ago goes out in the request, the clock
runs from sending it to reading the generated ids back. The worker cannot start before the
prompt exists, cannot end before its answer is complete, and its answer is checked against the
fp32 reference afterwards (``scoring.timed_output_agreement``).
"""

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
from contextlib import contextmanager
from pathlib import Path

import torch

from tilegym_hf_bench.errors import BenchError
from tilegym_hf_bench.isolation.audit_hook import REFUSED_EXIT, read_refusals
from tilegym_hf_bench.worker_wire import Reader, WireError, read_tensors, send

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

    def __init__(self, *, device: str, scratch: Path, src_root: Path, watched: list[str], log):
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
            "watched_modules": list(watched),
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
        return self._calls.submit(self._call, message, CALL_TIMEOUT_S)

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

    def close(self) -> None:
        for line in read_refusals(self.refusal_log):
            if line.startswith("would refuse"):
                self.log(f"audit (record only): {line}")
        if self.proc.poll() is None:
            try:
                send(self._out, {"op": "exit"})
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._calls.shutdown(wait=True, cancel_futures=True)
        os.close(self._out)
        os.close(self._reader.fd)
        self._relay.join(timeout=5)


def _rows(ids: torch.Tensor) -> list[list[int]]:
    return ids.cpu().tolist()


class RemoteSide:
    """The interface ``throughput`` and the correctness check use, over a ``ModelWorker``."""

    def __init__(
        self,
        worker: ModelWorker,
        mode: str,
        prompt: torch.Tensor,
        started: Future | None = None,
        log=None,
    ):
        self.worker = worker
        self.mode = mode
        self.prompt = prompt.cpu()
        self.mask: torch.Tensor | None = None
        self._files = 0
        self._started = started
        self._log = log
        self.started_s: float | None = None  # seconds from sending init to its answer

    def wait_started(self) -> None:
        """Wait for the worker's ``init`` (sent before this process built its own side) and log
        its lines once; its failure is raised here."""
        if self._started is None:
            return
        started, self._started = self._started, None
        reply = started.result()
        self.started_s = reply["_elapsed_s"]
        if self._log is not None:
            for line in reply.get("lines") or []:
                self._log(f"[worker] {line}")
            self._log(f"model worker: started and patched in {reply['_elapsed_s']:.1f} s")

    def frozen(self):
        return self.worker.frozen()

    def pause_gc(self) -> None:
        """Before a timed round, outside the clock: the worker collects and pauses its cyclic
        GC, as this process does for its own side."""
        self.wait_started()
        self.worker.call({"op": "gc"})

    def use_prompt(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        self.prompt = ids.cpu()
        self.mask = None if mask is None else mask.cpu()

    def _request(self, new_tokens: int, **extra) -> dict:
        return {
            "op": "generate",
            "mode": self.mode,
            "ids": _rows(self.prompt),
            "mask": None if self.mask is None else _rows(self.mask),
            "new_tokens": new_tokens,
            **extra,
        }

    def _sequences(self, reply: dict, new_tokens: int) -> torch.Tensor:
        tokens = reply.get("tokens")
        try:
            new = torch.tensor(tokens, dtype=torch.long)
        except (TypeError, ValueError, RuntimeError):
            raise BenchError("cuTile side: the worker's answer holds no token ids") from None
        if new.shape != (self.prompt.shape[0], new_tokens):
            raise BenchError(
                f"cuTile side: the worker answered {tuple(new.shape)} token ids, expected "
                f"{(self.prompt.shape[0], new_tokens)}"
            )
        return torch.cat([self.prompt, new], dim=1)

    def timed(self, new_tokens: int, ids=None, label: str | None = None):
        """(wall seconds, sequences) of one worker generate(), timed here: from sending the
        request that carries the prompt to reading the answer."""
        self.wait_started()
        if ids is not None:
            self.use_prompt(ids)
        message = self._request(new_tokens, guard=label)
        start = time.perf_counter()
        reply = self.worker.call(message)
        seconds = time.perf_counter() - start
        return seconds, self._sequences(reply, new_tokens)

    def submit_generate(self, new_tokens: int) -> Future:
        """An untimed generate() on the current prompt, sent without waiting (warm-up: the
        worker compiles while this process compiles its own side)."""
        return self.worker.submit(self._request(new_tokens))

    def generate_with_logits(self, new_tokens: int, mode: str | None = None):
        return self.start_logits(new_tokens, mode)()

    def start_logits(self, new_tokens: int, mode: str | None = None):
        """Ask for (sequences, fp32 logits [B, N, V]) of one generate() and return at once; the
        returned function waits, reads the file the worker wrote (safetensors: data only) and
        checks its shapes, so this process scores its own side meanwhile."""
        self.wait_started()
        self._files += 1
        name = f"logits-{self._files}"
        extra = {"logits": True, "name": name}
        if mode is not None:
            extra["mode"] = mode
        pending = self.worker.submit(self._request(new_tokens, **extra))
        prompt = self.prompt

        def finish():
            pending.result()
            tensors = read_tensors(self.worker.scratch, name)
            seq, logits = tensors.get("sequences"), tensors.get("logits")
            batch, length = prompt.shape
            if (
                seq is None
                or logits is None
                or tuple(seq.shape) != (batch, length + new_tokens)
                or logits.ndim != 3
                or tuple(logits.shape[:2]) != (batch, new_tokens)
            ):
                raise BenchError("cuTile side: the worker's logits file has the wrong shapes")
            if not torch.equal(seq[:, :length].long(), prompt):
                raise BenchError("cuTile side: the worker generated from another prompt")
            return seq.long(), logits.float()

        return finish

    def profile(self, new_tokens: int) -> dict:
        self.wait_started()
        self._files += 1
        name = f"profile-{self._files}"
        message = self._request(new_tokens, name=name)
        message["op"] = "profile"
        self.worker.call(message)
        path = self.worker.scratch / f"{name}.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise BenchError(f"cuTile side: the profile file is unreadable: {exc}") from None
