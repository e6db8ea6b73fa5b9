"""Variant sweeps for the op benchmarks: one table row per (case, variant), and a ``--warm I/N``
mode that only launches every variant once (worker I of N), so N processes can fill cuTile's
on-disk kernel cache in parallel before the timed run (compiles dominate a cold sweep).

A case is ``(op, shape, {name: callable}, nbytes)``; names are variant names, plus "torch".
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable

import torch
from _timing import format_table, gbps, interleaved, pct_of_copy

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


def sweep_table(cases: Iterable[Case], default: dict[str, str], iters: int = 30) -> str:
    """Interleaved timing of every variant of every case; ``default[op]`` is marked ``*``."""
    rows = []
    for op, shape, fns, nbytes in cases:
        stats = interleaved(fns, iters=iters)
        base = stats.get("torch")
        for name, st in stats.items():
            mark = "*" if default.get(op) == name else ""
            vs = f"{base.median_us / st.median_us:.2f}x" if base else "-"
            rows.append(
                [
                    op,
                    shape,
                    name + mark,
                    st.median_us,
                    st.spread_pct,
                    vs,
                    gbps(nbytes, st),
                    pct_of_copy(nbytes, st),
                ]
            )
    header = ["op", "shape", "variant", "us", "spread%", "vs_torch", "GB/s", "%copy"]
    return format_table(header, rows)
