"""Timed runs never compile. Compiling (and, on a GPU, capturing CUDA graphs) is warm-up: a
timed run that compiles measures the compiler, not the kernels, so it ends the run as not ok.

Two checks. torch.compile's documented ``torch.compiler.set_stance("fail_on_recompile")``
(torch >= 2.6): under it, any call into a compiled region that finds no compiled code valid for
its inputs raises instead of compiling, with dynamo's guard failures as the reason. And CUDA
graph recordings: the stance does not see them, because ``mode="reduce-overhead"`` records a new
graph at run time, without compiling, whenever no recorded graph fits the inputs (for example
a static KV cache at new addresses); Dynamo announces each recording to its compile callbacks,
which ``graph_recordings`` listens to.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from tilegym_hf_bench.errors import BenchError

try:
    from torch._dynamo.callback import CallbackTrigger, callback_handler
except ImportError:  # a torch without Dynamo's compile callbacks: no recordings to hear of
    CallbackTrigger = callback_handler = None

_STANCE = "fail_on_recompile"
_REASON_CHARS = 400


def guard_available() -> bool:
    return hasattr(torch, "compiler") and hasattr(torch.compiler, "set_stance")


def require_guard(mode: str) -> None:
    """A compiled mode is only measured where a compile inside a timed run can be caught."""
    if not guard_available():
        raise BenchError(
            f"--mode {mode} needs torch >= 2.6 (torch.compiler.set_stance catches a compile "
            f"inside a timed run); torch is {torch.__version__}"
        )


def recompile_reason(message: str) -> str:
    """dynamo's multi-line error as one line: which function, and the guards that failed."""
    text = re.sub(r"\s+", " ", message).strip()
    text = text.replace("Detected recompile when torch.compile stance is 'fail_on_recompile'. ", "")
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


@contextmanager
def graph_recordings() -> Iterator[list[str]]:
    """The body's CUDA graph recordings, as a list that fills while it runs (each item the
    compile id of the function recorded)."""
    recorded: list[str] = []

    def heard(args) -> None:
        if args.callback_trigger == CallbackTrigger.CUDAGRAPH_RECORDING:
            recorded.append(str(args.compile_id))

    if callback_handler is None:
        yield recorded
        return
    callback_handler.register_start_callback(heard)
    try:
        yield recorded
    finally:
        callback_handler.remove_start_callback(heard)


@contextmanager
def no_compile(label: str) -> Iterator[None]:
    """Run the body with compiling and CUDA graph recording forbidden; either becomes a
    ``BenchError`` naming ``label`` (e.g. "timed run 3/10, baseline"). Without ``set_stance``
    (torch < 2.6) the body runs unchecked: nothing compiles in eager mode, and compiled modes
    call ``require_guard``."""
    if not guard_available():
        yield
        return
    try:
        with torch.compiler.set_stance(_STANCE), graph_recordings() as recorded:
            yield
    except RuntimeError as exc:
        if _STANCE not in str(exc):
            raise
        raise BenchError(
            f"{label}: torch.compile needed a new compile inside a timed run (its time would "
            f"include compiling), so the run is not ok ({recompile_reason(str(exc))})"
        ) from None
    if recorded:
        raise BenchError(
            f"{label}: {len(recorded)} CUDA graph(s) recorded inside a timed run (compiled "
            f"function {', '.join(sorted(set(recorded)))}; recording is warm-up, and no recorded "
            "graph fit the inputs, e.g. a KV cache at new addresses), so the run is not ok"
        )
