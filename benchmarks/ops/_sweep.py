"""Variant sweeps for the op benchmarks: one table row per (case, variant), and a ``--warm I/N``
mode that only launches every variant once (worker I of N), so N processes can fill cuTile's
on-disk kernel cache in parallel before the timed run (compiles dominate a cold sweep).

A case is ``(op, shape, {name: callable}, nbytes)``; names are variant names, plus "torch".
"""

from __future__ import annotations

import argparse
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
