"""Kernel events to a coverage table: GPU time per kernel and module, cuTile share. Pure.

Model: every GPU kernel is linked (by a correlation id) to the host event that launched it;
that host event happened on a thread at a time; the module that launched the kernel is the
innermost module range (a profiler annotation pushed by a forward pre-hook, popped by the
forward hook) open on that thread at that time. torch.profiler and Nsight Systems both give
these three kinds of record.

GPU time counts each instant once (`exclusive_ns`): kernels can overlap in the record (a
programmatic dependent is recorded from its placement, while it still waits for the kernel
before it; kernels on two streams), and summing their durations would count the overlap
twice, for whichever side made it. An instant in which a kernel other than cuTile's runs is
never cuTile's.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# names of the profiler ranges that the forward hooks push around every module's forward
MODULE_RANGE_PREFIX = "tilegym.module:"


@dataclass(frozen=True)
class KernelEvent:
    name: str
    duration_ns: int
    link_id: int  # id of the launching host event (any sign); 0 when the profiler gave none
    start_ns: int | None = None  # on the GPU timeline; None when the record has no start


@dataclass(frozen=True)
class HostEvent:
    id: int
    thread: int
    start_ns: int


@dataclass(frozen=True)
class ModuleRange:
    module: str
    thread: int
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class KernelRow:
    name: str
    module: str | None
    calls: int
    gpu_ns: int
    cutile: bool


@dataclass(frozen=True)
class Coverage:
    rows: list[KernelRow]  # largest GPU time first
    total_ns: int
    cutile_ns: int
    launches: int
    cutile_launches: int
    overlap_ns: int = 0  # recorded kernel time that another kernel's record already covered

    @property
    def gpu_time_pct(self) -> float:
        return 100.0 * self.cutile_ns / self.total_ns if self.total_ns else 0.0

    @property
    def launch_pct(self) -> float:
        return 100.0 * self.cutile_launches / self.launches if self.launches else 0.0


_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")


def normalize_module(qualname: str) -> str:
    """``model.layers.17.mlp`` -> ``model.layers.*.mlp``: one row for all layers."""
    return _INDEX.sub("*", qualname)


def enclosing_modules(
    queries: Iterable[HostEvent], ranges: Iterable[ModuleRange]
) -> dict[int, str | None]:
    """Host event id -> innermost module range open on its thread at its start (None if none).

    A sweep per thread: at equal times ranges open before queries and close after them, outer
    ranges open first and close last, so a launch on a range's edge belongs to that range.
    """
    OPEN, QUERY, CLOSE = 0, 1, 2
    per_thread: dict[int, list[tuple]] = defaultdict(list)
    for r in ranges:
        per_thread[r.thread].append((r.start_ns, OPEN, -r.end_ns, r))
        per_thread[r.thread].append((r.end_ns, CLOSE, -r.start_ns, r))
    for q in queries:
        per_thread[q.thread].append((q.start_ns, QUERY, 0, q))
    answer: dict[int, str | None] = {}
    for items in per_thread.values():
        items.sort(key=lambda item: item[:3])
        stack: list[ModuleRange] = []
        for _time, kind, _order, obj in items:
            if kind == OPEN:
                stack.append(obj)
            elif kind == CLOSE:
                for i in range(len(stack) - 1, -1, -1):
                    if stack[i] is obj:
                        del stack[i]
                        break
            else:
                answer[obj.id] = stack[-1].module if stack else None
    return answer


def _first_started(kernels: list[KernelEvent], durations: list[int], ids) -> dict[int, tuple]:
    """Kernel index -> the (start, end) part of its interval that no kernel of ``ids`` started
    before it covers. The parts are disjoint and come in order of start; their union is that
    of the kernels' intervals."""
    parts: dict[int, tuple[int, int]] = {}
    covered: int | None = None
    for start, i in sorted((kernels[i].start_ns, i) for i in ids):
        end = start + durations[i]
        lo = start if covered is None else min(max(start, covered), end)
        parts[i] = (lo, end)
        covered = end if covered is None else max(covered, end)
    return parts


def _overlap(lo: int, hi: int, spans: list[tuple[int, int]], starts: list[int]) -> int:
    """Length of [lo, hi) inside the disjoint, ordered ``spans`` (``starts``: their starts)."""
    total = 0
    for a, b in spans[max(bisect.bisect_right(starts, lo) - 1, 0) :]:
        if a >= hi:
            break
        total += max(0, min(b, hi) - max(a, lo))
    return total


def exclusive_ns(kernels: list[KernelEvent], is_cutile: Callable[[str], bool]) -> list[int]:
    """Each kernel's share of the GPU's busy time, every instant counted once: an instant in
    which any other-than-cuTile kernel runs is theirs, one in which only cuTile kernels run is
    cuTile's, and within a side it goes to the kernel that started first among those running
    (ties: the earlier record). So a dependent placed while the kernel before it still runs is
    charged from that kernel's end, and a cuTile kernel running beside PyTorch's (another
    stream) takes none of their time. A kernel with no start keeps its whole duration."""
    durations = [max(k.duration_ns, 0) for k in kernels]
    timed = [i for i, k in enumerate(kernels) if k.start_ns is not None]
    cutile = [i for i in timed if is_cutile(kernels[i].name)]
    other = [i for i in timed if not is_cutile(kernels[i].name)]
    other_parts = _first_started(kernels, durations, other)
    for i, (lo, hi) in other_parts.items():
        durations[i] = hi - lo
    spans = sorted(p for p in other_parts.values() if p[1] > p[0])
    starts = [a for a, _ in spans]
    for i, (lo, hi) in _first_started(kernels, durations, cutile).items():
        durations[i] = hi - lo - _overlap(lo, hi, spans, starts)
    return durations


def aggregate(
    kernels: Iterable[KernelEvent],
    hosts: Iterable[HostEvent],
    ranges: Iterable[ModuleRange],
    is_cutile: Callable[[str], bool],
) -> Coverage:
    """Group kernels by (name, normalized module); sum calls and GPU time (`exclusive_ns`);
    classify."""
    kernels = list(kernels)
    linked = {k.link_id for k in kernels if k.link_id}
    launchers = [h for h in hosts if h.id in linked]
    module_of = enclosing_modules(launchers, ranges)
    calls: dict[tuple[str, str | None], int] = defaultdict(int)
    gpu_ns: dict[tuple[str, str | None], int] = defaultdict(int)
    shares = exclusive_ns(kernels, is_cutile)
    for k, share in zip(kernels, shares, strict=True):
        module = module_of.get(k.link_id)
        key = (k.name, normalize_module(module) if module is not None else None)
        calls[key] += 1
        gpu_ns[key] += share
    rows = [
        KernelRow(name, module, calls[(name, module)], gpu_ns[(name, module)], is_cutile(name))
        for (name, module) in calls
    ]
    rows.sort(key=lambda r: (-r.gpu_ns, r.name, r.module or ""))
    return Coverage(
        rows=rows,
        total_ns=sum(r.gpu_ns for r in rows),
        cutile_ns=sum(r.gpu_ns for r in rows if r.cutile),
        launches=sum(r.calls for r in rows),
        cutile_launches=sum(r.calls for r in rows if r.cutile),
        overlap_ns=sum(max(k.duration_ns, 0) for k in kernels) - sum(shares),
    )


def coverage_block(cov: Coverage, profiler: str) -> dict:
    """The metrics file's ``coverage`` object."""
    return {
        "gpu_time_pct": round(cov.gpu_time_pct, 4),
        "launch_pct": round(cov.launch_pct, 4),
        "total_gpu_ms": cov.total_ns / 1e6,
        "overlap_gpu_ms": cov.overlap_ns / 1e6,
        "profiler": profiler,
        "kernels": [
            {
                "name": r.name,
                "calls": r.calls,
                "gpu_ms": r.gpu_ns / 1e6,
                "cutile": r.cutile,
                "module": r.module,
            }
            for r in cov.rows
        ],
    }


def recount(block: dict, is_cutile: Callable[[str], bool]) -> dict:
    """The ``coverage`` block recomputed from its own kernel list with ``is_cutile``: every
    number the decision reads (flags, shares, total) from the raw rows, none taken as stored."""
    kernels = [{**k, "cutile": bool(is_cutile(k["name"]))} for k in block["kernels"]]
    total = sum(k["gpu_ms"] for k in kernels)
    cutile = sum(k["gpu_ms"] for k in kernels if k["cutile"])
    launches = sum(k["calls"] for k in kernels)
    cutile_launches = sum(k["calls"] for k in kernels if k["cutile"])
    return {
        **block,
        "gpu_time_pct": round(100.0 * cutile / total, 4) if total else 0.0,
        "launch_pct": round(100.0 * cutile_launches / launches, 4) if launches else 0.0,
        "total_gpu_ms": total,
        "kernels": kernels,
    }
