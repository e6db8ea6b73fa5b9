"""Where a patched MoE block that does not call its router module (the router's linear runs as
a cuTile GEMM and the top-k as a routing op) says which experts it chose, so a listener can
record a patched model's routing as a forward hook on the upstream router records the
upstream model's. The benchmark's model worker listens while it reports the routing of the
tokens it generated (``tilegym_hf_bench.routing_report``); nothing listens otherwise, and the
call is then a check of an empty list (Dynamo guards on it and traces nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

Listener = Callable[[torch.nn.Module, torch.Tensor], None]
_listeners: list[Listener] = []


def chose(router: torch.nn.Module, ids: torch.Tensor) -> None:
    """``router``'s block routed its tokens to ``ids`` [T, k] in this forward."""
    for listener in _listeners:
        listener(router, ids)


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)
