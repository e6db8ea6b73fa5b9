"""Time a few-microsecond kernel as a model's decode step runs it: many calls back to back
in one CUDA graph (launch gaps as in a replayed step, no host time), median over replays.

``graph_us(fn, calls, replays) -> (median, min, max)`` in microseconds per call;
``interleaved_graphs({name: fn}, calls, replays)`` captures one graph per variant and replays
them in turn, so clock drift hits every variant alike; ``graphed(fn)`` is one call of ``fn``
captured, as its graph's ``replay`` (for timing with ``_timing``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def capture(fn: Callable[[], object], calls: int) -> torch.cuda.CUDAGraph:
    """A graph of ``calls`` back-to-back calls of ``fn`` (warmed up on a side stream first)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def graphed(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` captured in a CUDA graph (after warm-up calls): calling the result replays it."""
    return capture(fn, 1).replay


def _replay_us(graph: torch.cuda.CUDAGraph) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000


def interleaved_graphs(
    fns: dict[str, Callable[[], object]], calls: int = 50, replays: int = 20
) -> dict[str, tuple[float, float, float]]:
    """{name: (median, min, max) microseconds per call}, the variants' graphs replayed in turn."""
    graphs = {name: capture(fn, calls) for name, fn in fns.items()}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(replays):
        for name, graph in graphs.items():
            samples[name].append(_replay_us(graph) / calls)
    return {n: (statistics.median(s), min(s), max(s)) for n, s in samples.items()}
