"""Variant sweeps for the op benchmarks: one table row per (case, variant), and a ``--warm I/N``
mode that only launches every variant once (worker I of N), so N processes can fill cuTile's
on-disk kernel cache in parallel before the timed run (compiles dominate a cold sweep).

A case is ``(op, shape, {name: callable}, nbytes)``; names are variant names, plus "torch".
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable

import torch
from _timing import gbps, interleaved, pct_of_copy

Case = tuple[str, str, dict[str, Callable[[], object]], int]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--warm", default=None, help="I/N: only launch worker I's share of the cases")
    p.add_argument("--iters", type=int, default=30)
    return p.parse_args()


def warm(cases: Iterable[Case], spec: str) -> None:
    """Launch each variant of every N-th case once (this worker's share), then synchronize."""
    i, n = (int(v) for v in spec.split("/"))
    for j, (_, _, fns, _) in enumerate(cases):
        if j % n == i:
            for fn in fns.values():
                fn()
    torch.cuda.synchronize()


HEADER = ["op", "shape", "variant", "us", "spread%", "vs_torch", "GB/s", "%copy"]
WIDTHS = [12, 13, 18, 8, 7, 8, 8, 6]


def _line(cells) -> str:
    text = [f"{c:.1f}" if isinstance(c, float) else str(c) for c in cells]
    return "  ".join(t.rjust(w) for t, w in zip(text, WIDTHS, strict=True))


def print_sweep(cases: Iterable[Case], default: dict[str, str], iters: int = 30) -> None:
    """Interleaved timing of every variant of every case, printed case by case (a timeout
    keeps the finished rows); ``default[op]`` is marked ``*``."""
    print(_line(HEADER))
    print(_line(["-" * w for w in WIDTHS]))
    for op, shape, fns, nbytes in cases:
        stats = interleaved(fns, iters=iters)
        base = stats.get("torch")
        for name, st in stats.items():
            mark = "*" if default.get(op) == name else ""
            vs = f"{base.median_us / st.median_us:.2f}x" if base else "-"
            cells = [op, shape, name + mark, st.median_us, st.spread_pct, vs]
            print(_line([*cells, gbps(nbytes, st), pct_of_copy(nbytes, st)]), flush=True)


CEIL_HEADER = ["op", "shape", "variant", "us", "spread%", "vs_torch", "GB/s", "%4.3TB", "%copy"]
CEIL_WIDTHS = [12, 13, 14, 8, 7, 8, 8, 6, 6, 8]


def _ceil_line(cells) -> str:
    text = [f"{c:.1f}" if isinstance(c, float) else str(c) for c in cells]
    return "  ".join(t.rjust(w) for t, w in zip(text, CEIL_WIDTHS, strict=False))


def copy_fn(nbytes: int) -> Callable[[], object]:
    """``dst.copy_(src)`` moving ``nbytes`` in all (``nbytes / 2`` read, as many written)."""
    src = torch.empty(max(1, nbytes // 2), dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def back_to_back_us(fn: Callable[[], object], calls: int = 50) -> float:
    """Wall time per call of ``calls`` back-to-back calls (no L2 flush, one sync at the end):
    max(host cost, GPU time) per call, what a decode loop without CUDA graphs sees."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def print_ceiling_sweep(
    cases: Iterable[Case], default: dict[str, str], iters: int = 30, b2b: Callable | None = None
) -> None:
    """``print_sweep`` plus a measured ceiling row per case, "copy": ``dst.copy_(src)`` of the
    same bytes in the same interleaved harness. Columns: % of the GPU's 1 GiB copy rate and %
    of the measured copy (copy time / variant time: what the harness allows at this size).
    ``b2b(shape)`` true adds a last column, back-to-back µs per call (host-bound at decode)."""
    print(_ceil_line([*CEIL_HEADER, "b2b_us"]))
    print(_ceil_line(["-" * w for w in CEIL_WIDTHS]))
    for op, shape, fns, nbytes in cases:
        stats = interleaved({**fns, "copy": copy_fn(nbytes)}, iters=iters)
        base, ceil = stats.get("torch"), stats["copy"]
        with_b2b = b2b is not None and b2b(shape)
        for name, st in stats.items():
            mark = "*" if default.get(op) == name else ""
            vs = f"{base.median_us / st.median_us:.2f}x" if base else "-"
            cells = [op, shape, name + mark, st.median_us, st.spread_pct, vs, gbps(nbytes, st)]
            cells += [pct_of_copy(nbytes, st), 100.0 * ceil.median_us / st.median_us]
            if with_b2b and name != "copy":
                cells.append(back_to_back_us(fns[name]))
            print(_ceil_line(cells), flush=True)
