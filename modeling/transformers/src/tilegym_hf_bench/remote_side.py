"""The cuTile side as the trusted process sees it: a model worker in its own process, driven
over the wire (``model_worker``), timed here.

A timed call is: the prompt this process drew a moment ago goes out in the request, the clock
runs from sending it to reading the generated ids back. The worker cannot start before the
prompt exists, cannot end before its answer is complete, and its answer is checked against the
fp32 reference afterwards (``scoring.timed_output_agreement``).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future

import torch

from tilegym_hf_bench.errors import BenchError
from tilegym_hf_bench.worker_client import ModelWorker
from tilegym_hf_bench.worker_wire import read_tensors


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

    def drain(self) -> None:
        self.worker.drain()

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
        return self.start_logits(new_tokens, mode)()[:2]

    def start_logits(self, new_tokens: int, mode: str | None = None, routing: bool = False):
        """Ask for (sequences, fp32 logits [B, N, V], routing report) of one generate() and
        return at once; the returned function waits, reads the file the worker wrote
        (safetensors: data only) and checks its shapes, so this process scores its own side
        meanwhile. It may be sent before the worker's start is answered: it is queued behind
        it. ``routing``: ask for the worker's report of its MoE routing on that sequence
        (``routing_report``; None from a model without routers), which the referee checks."""
        self._files += 1
        name = f"logits-{self._files}"
        extra = {"logits": True, "name": name}
        if mode is not None:
            extra["mode"] = mode
        if routing:
            extra["routing"] = True
        pending = self.worker.submit(self._request(new_tokens, **extra))
        prompt = self.prompt

        def finish():
            self.wait_started()
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
            return seq.long(), logits.float(), reported(tensors) if routing else None

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


def reported(tensors: dict) -> list | None:
    """The routing report in a logits file: ``routing-0``, ``routing-1``... one per MoE layer
    (None without any; the referee checks their shapes and ids)."""
    layers = []
    while (ids := tensors.get(f"routing-{len(layers)}")) is not None:
        layers.append(ids)
    return layers or None
