"""A side's report of how its own model routed the tokens of a sequence it generated: the
experts each MoE layer chose at every input position, recorded during the very generate() the
side is scored on. The routing referee offers each side fp32 routed as it reports, wherever
fp32 could make that choice within bf16's rounding (``routing_rule.within_reach``).

The record is written on the device by the forward itself: each router's choice is copied
into a buffer at a device cursor, so a compiled static decode step (CUDA graphs, no host value
between steps) records what it routed, not what an eager replay of it would route. On the H200
the two differ: qwen3_next's and gpt_oss's compiled PyTorch steps flipped near-ties that their
eager replays did not (docs/results/h200-2026-12-05).

Both sides record the same way: the trusted PyTorch side here, the judged side in its worker
(``model_worker``), whose report is data the referee checks, not a fact it trusts. An upstream
router says its choice through a forward hook that ``install`` puts on it before anything is
compiled (``Generator`` does); a patched block that does not call its router says it through
``tilegym.transformers.routing_tap``. Either call loops over a list of listeners, empty but
while a record is made: Dynamo guards on the list, so the compiled step without a listener
traces nothing, and the first recorded generate() compiles a step that writes the record (it
does not guard on the hooks themselves: one added after compiling would never run).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

import torch

from tilegym_hf_bench.errors import BenchError
from tilegym_hf_bench.routing import routers

Listener = Callable[[torch.nn.Module, torch.Tensor], None]
_listeners: list[Listener] = []
#: each model's record, reused while it has room: its buffers keep their addresses, so a
#: compiled step's CUDA graphs recorded with them stay valid
_records: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _tap():
    """The patched blocks' tap, where the patch is importable (the CPU tests' PyTorch-only
    workers run without it; a model nothing patched never calls it)."""
    try:
        from tilegym.transformers import routing_tap
    except ImportError:
        return None
    return routing_tap


def _said(router: torch.nn.Module, args, output) -> None:
    """The forward hook ``install`` puts on each upstream router: its choice to the listeners."""
    for listener in _listeners:
        listener(router, output[2])


def install(model: torch.nn.Module) -> None:
    """Hook each router of ``model`` (once) so a later record hears it: call before the model's
    first compiled forward."""
    for router, _ in routers(model):
        if _said not in router._forward_hooks.values():
            router.register_forward_hook(_said)


@contextmanager
def _listening(listener: Listener) -> Iterator[None]:
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


class _Record:
    """Per MoE layer a [rows, k] buffer of expert ids and a one-element write cursor, both on
    the model's device at fixed addresses (static inputs of a compiled step's CUDA graphs).
    A forward's choice [T, k] goes to the next T rows, in call order: the prompt's forward,
    then one row a sequence per decode step."""

    def __init__(self, found: list, rows: int, device: torch.device):
        self.routers = [router for router, _ in found]
        self.rows = rows
        self.ids = [
            torch.full((rows, router.top_k), -1, dtype=torch.int64, device=device)
            for router in self.routers
        ]
        self.cursor = [torch.zeros(1, dtype=torch.int64, device=device) for _ in self.routers]
        for t in self.ids + self.cursor:
            torch._dynamo.mark_static_address(t)

    def clear(self) -> None:
        for ids, cursor in zip(self.ids, self.cursor, strict=True):
            ids.fill_(-1)
            cursor.zero_()

    def put(self, layer: int, ids: torch.Tensor) -> None:
        """Device work only (traced into a compiled step): rows past the end wrap around, and
        ``report`` then refuses the record rather than the copy faulting."""
        n = ids.shape[0]
        slots = (self.cursor[layer] + torch.arange(n, device=ids.device)) % self.rows
        self.ids[layer].index_copy_(0, slots, ids.to(torch.int64))
        self.cursor[layer].add_(n)

    def tapped(self, router: torch.nn.Module, ids: torch.Tensor) -> None:
        for layer, mine in enumerate(self.routers):
            if mine is router:
                self.put(layer, ids)

    def report(self, batch: int, prompt_len: int, new_tokens: int) -> list[torch.Tensor]:
        """Per layer [B x (S - 1), k], rows then positions, as the teacher-forced fp32
        reference indexes them (the last generated token is never an input)."""
        expected = batch * (prompt_len + new_tokens - 1)
        out = []
        for layer, (ids, cursor) in enumerate(zip(self.ids, self.cursor, strict=True)):
            written = int(cursor.item())
            if written != expected:
                raise BenchError(
                    f"internal: MoE layer {layer} recorded {written} routed tokens in a "
                    f"generate() of {batch} x {prompt_len} -> {new_tokens} (expected {expected})"
                )
            prompt = ids[: batch * prompt_len].reshape(batch, prompt_len, -1)
            steps = ids[batch * prompt_len : expected].reshape(new_tokens - 1, batch, -1)
            out.append(torch.cat([prompt, steps.transpose(0, 1)], dim=1).reshape(expected, -1))
        return out


def generate_reporting(
    model, generate: Callable[[], tuple], batch: int, prompt_len: int, new_tokens: int
) -> tuple:
    """(sequences, logits, report) of ``generate()`` (which returns the first two) run with
    ``model``'s routers recorded; the report is None for a model without routers. Per MoE layer
    (``routing.routers`` order) it holds the [B x (S - 1), k] experts that generate() routed
    input position p of each row to, rows then positions."""
    found = routers(model)
    if not found:
        return (*generate(), None)
    install(model)
    rows = batch * (prompt_len + new_tokens)
    record = _records.get(model)
    if record is None or record.rows < rows:
        record = _records[model] = _Record(found, rows, next(model.parameters()).device)
    record.clear()
    tap = _tap()
    with _listening(record.tapped), tap.listening(record.tapped) if tap else nullcontext():
        seq, logits = generate()
    return seq, logits, record.report(batch, prompt_len, new_tokens)
