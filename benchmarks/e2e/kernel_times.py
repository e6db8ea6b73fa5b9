"""Per-call GPU time of the kernels a benchmark profiled inside the model, from metrics files.

A metrics file's ``coverage.kernels`` holds every kernel's calls and total GPU time over one
profiled ``generate()``. Their quotient is what the kernel takes in the model: its own L2 state,
graph replay and neighbours. An op benchmark stands in for that with a flushed L2 of its own
choosing. After a write flush the L2 is full of dirty lines that the timed kernel writes back
as it reads (``benchmarks/ops/_timing.py``), so for a short weight stream the op benchmark can
be far slower than the same kernel in the model.

    python benchmarks/e2e/kernel_times.py METRICS.json [...] --match moe --calls 1016

Selected kernels with one call count (a kernel launched once a layer and decode step) are also
summed per call: the time of that chain per layer and step.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from tilegym_hf_bench.metrics_schema import validation_errors


def kernel_rows(doc: dict) -> list[dict]:
    """The coverage table's kernels that ran at least once; ValueError for a document that
    fails the metrics schema or has no table."""
    errors = validation_errors(doc)
    if errors:
        raise ValueError(f"not a bench metrics file: {errors[0]}")
    if not doc["coverage"] or not doc["coverage"]["kernels"]:
        raise ValueError("no coverage.kernels table (a run without the profile?)")
    return [k for k in doc["coverage"]["kernels"] if k["calls"] > 0]


def select(kernels: list[dict], match: str | None, calls: int | None) -> list[dict]:
    """Rows whose name matches ``match`` (a regular expression) and, if given, with ``calls``
    calls, largest total first."""
    pattern = re.compile(match) if match else None
    rows = [
        k
        for k in kernels
        if (pattern is None or pattern.search(k["name"])) and (calls is None or k["calls"] == calls)
    ]
    return sorted(rows, key=lambda k: -k["gpu_ms"])


def short_name(name: str) -> str:
    """A cuTile kernel's name without its specialization suffix (``_Kt...``)."""
    return name.split("_Kt", 1)[0] if "_Kt" in name else name[:80]


def table(label: str, rows: list[dict]) -> list[str]:
    lines = [
        f"## {label}",
        "| kernel | cuTile | calls | GPU ms | µs a call |",
        "|---|---|---|---|---|",
    ]
    for k in rows:
        us = 1000.0 * k["gpu_ms"] / k["calls"]
        lines.append(
            f"| {short_name(k['name'])} | {'yes' if k.get('cutile') else 'no'} | {k['calls']} "
            f"| {k['gpu_ms']:.3f} | {us:.2f} |"
        )
    if len({k["calls"] for k in rows}) == 1 and len(rows) > 1:
        total = sum(1000.0 * k["gpu_ms"] / k["calls"] for k in rows)
        lines.append(f"| all {len(rows)} above, per call | | {rows[0]['calls']} | | {total:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("metrics", nargs="+", help="bench metrics JSON files (--metrics-out)")
    p.add_argument("--match", help="only kernels whose name matches this regular expression")
    p.add_argument("--calls", type=int, help="only kernels called exactly this many times")
    a = p.parse_args(argv)
    if a.match:
        try:
            re.compile(a.match)
        except re.error as exc:
            print(f"error: --match {a.match!r}: {exc}", file=sys.stderr)
            return 2
    out: list[str] = []
    for path in a.metrics:
        try:
            kernels = kernel_rows(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as exc:
            print(f"{path}: error: {exc}", file=sys.stderr)
            return 2
        rows = select(kernels, a.match, a.calls)
        if not rows:
            print(f"{path}: error: no kernel matches", file=sys.stderr)
            return 1
        out += table(path, rows) + [""]
    print("\n".join(out).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
