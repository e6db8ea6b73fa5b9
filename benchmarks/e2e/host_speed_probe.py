"""How steady is this host's CPU? A fixed pure-Python workload timed again and again.

Static-mode ``generate()`` of a small model is host-bound: its tokens/s follows the speed at
which the host runs Python. This times the same interpreter work (about 0.3 s, calibrated at
start) N times, alternating between the process's own CPU set and one pinned core, and prints
each block's median, CV and range and the per-run times in order: on a steady host both CVs are
about 1%; phases of slow and fast runs that pinning does not remove are the host's (another
tenant, frequency changes), and no benchmark setting can take them out of a host-bound run.

    python benchmarks/e2e/host_speed_probe.py --runs 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

TARGET_S = 0.3


def work(n: int) -> int:
    """Integer arithmetic and dict stores: the interpreter-bound kind of work generate() does."""
    total = 0
    seen: dict[int, int] = {}
    for i in range(n):
        total += i * i % 7
        seen[i & 1023] = total
    return total


def calibrate() -> int:
    """Iterations that take about TARGET_S seconds here."""
    n = 100_000
    while True:
        start = time.perf_counter()
        work(n)
        took = time.perf_counter() - start
        if took > 0.05:
            return max(1, int(n * TARGET_S / took))
        n *= 2


def timed(n: int) -> float:
    start = time.perf_counter()
    work(n)
    return time.perf_counter() - start


def summary(name: str, times: list[float]) -> str:
    cv = 100 * statistics.pstdev(times) / statistics.fmean(times)
    return (
        f"| {name} | {1e3 * statistics.median(times):.1f} | {cv:.2f}% "
        f"| {1e3 * min(times):.1f}-{1e3 * max(times):.1f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="runs per block (default 30)")
    args = parser.parse_args(argv)
    if args.runs < 3:
        parser.error("--runs must be at least 3")
    cpus = sorted(os.sched_getaffinity(0))
    pinned = {cpus[len(cpus) // 2]}
    n = calibrate()
    blocks: dict[str, list[float]] = {"all CPUs": [], f"pinned to CPU {min(pinned)}": []}
    try:
        for _ in range(args.runs):
            for name, cpu_set in zip(blocks, (set(cpus), pinned), strict=True):
                os.sched_setaffinity(0, cpu_set)
                blocks[name].append(timed(n))
    finally:
        os.sched_setaffinity(0, set(cpus))
    print(f"# {len(cpus)} CPUs, {n} iterations a run, {args.runs} runs a block, interleaved")
    print("| block | median ms | CV | min-max ms |")
    print("|---|---|---|---|")
    for name, times in blocks.items():
        print(summary(name, times))
    print("\nper run, in order (ms, all CPUs / pinned):")
    pairs = zip(*blocks.values(), strict=True)
    print(" ".join(f"{1e3 * a:.0f}/{1e3 * b:.0f}" for a, b in pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
