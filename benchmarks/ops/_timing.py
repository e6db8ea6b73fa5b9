"""Shared GPU timing helper for the op benchmarks: CUDA events, warm-up, medians, L2 flush.

Import it as a plain module from this directory (``sys.path.insert(0, dirname(__file__))``
then ``from _timing import time_cuda, interleaved, Stats``). The API is stable:

- ``time_cuda(fn, warmup=10, iters=50, flush_l2=True) -> Stats``
- ``interleaved(fns, warmup=10, iters=50, flush_l2=True) -> dict[str, Stats]``: the variants
  take turns iteration by iteration, so clock and thermal drift hit all of them alike.
- ``gbps(nbytes, stats)``, ``pct_of_copy(nbytes, stats)`` turn bytes moved into bandwidth.

Every timed call is bracketed by its own pair of CUDA events; with ``flush_l2`` a buffer larger
than the L2 cache is touched before each call (outside the events), so inputs come from HBM.
How it is touched is ``TILEGYM_BENCH_FLUSH``: ``write`` (default) overwrites it, which leaves
the L2 full of dirty lines that the timed kernel then writes back as it reads its inputs (about
doubling a small memory-bound kernel's traffic); ``read`` reads it, leaving clean lines, as a
model's previous kernels mostly do.

After the flush the GPU spins for ``HEADROOM_CYCLES`` (``torch.cuda._sleep``) before the start
event, so the host has enqueued the timed call before the GPU reaches it: otherwise a call with
tens of microseconds of host work (several launches) gets its host time counted as GPU time.
"""

from __future__ import annotations

import functools
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

HBM_TBPS = (("H200", 4.8), ("H100 NVL", 3.9), ("H100 PCIe", 2.0), ("H100", 3.35))
"""Spec HBM bandwidth in TB/s by a name part, most specific first: weight-read floors must use
the GPU that ran (an H100's floor at the H200's 4.8 reads 1.43x too low)."""


def hbm_tbps(device_name: str) -> float | None:
    """The spec HBM bandwidth of the GPU called ``device_name``; None where it is not listed."""
    for part, tbps in HBM_TBPS:
        if part in device_name:
            return tbps
    return None


def running_gpu_tbps() -> tuple[float, str]:
    """(spec HBM TB/s, name) of the running GPU; a one-line ValueError for a GPU that
    ``HBM_TBPS`` does not list (the caller's ``--tbps`` then says it)."""
    name = torch.cuda.get_device_name()
    tbps = hbm_tbps(name)
    if tbps is None:
        raise ValueError(f"no HBM bandwidth known for {name}: pass --tbps")
    return tbps, name


_FLUSH_BYTES = 256 * 1024 * 1024  # well above any current L2 (H200: 60 MiB)
FLUSH_MODES = ("write", "read")
HEADROOM_CYCLES = 400_000  # ~200 us at the H200's 1.98 GHz: more than any timed call's host work
_flush_buf: torch.Tensor | None = None


@dataclass(frozen=True)
class Stats:
    """Percentiles of one kernel's per-call GPU time in microseconds."""

    median_us: float
    p10_us: float
    p90_us: float
    n: int

    @property
    def spread_pct(self) -> float:
        """(p90 - p10) / median, in percent: how noisy the measurement was."""
        return 100.0 * (self.p90_us - self.p10_us) / self.median_us if self.median_us else 0.0


def flush_mode() -> str:
    """The L2 flush of this process (``TILEGYM_BENCH_FLUSH``, default ``write``)."""
    mode = os.environ.get("TILEGYM_BENCH_FLUSH", "write")
    if mode not in FLUSH_MODES:
        raise SystemExit(f"error: TILEGYM_BENCH_FLUSH={mode!r} must be one of {FLUSH_MODES}")
    return mode


def _flush() -> None:
    global _flush_buf
    if _flush_buf is None:
        _flush_buf = torch.ones(_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    if flush_mode() == "read":
        _flush_buf.max()
    else:
        _flush_buf.zero_()


def _percentile(sorted_vals: list[float], q: float) -> float:
    if len(sorted_vals) == 1:
        return sorted_vals[0]
    pos = q * (len(sorted_vals) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def summarize(samples_us: list[float]) -> Stats:
    """Median and 10th/90th percentiles of timing samples (pure, testable without a GPU)."""
    if not samples_us:
        raise ValueError("no timing samples")
    s = sorted(samples_us)
    return Stats(statistics.median(s), _percentile(s, 0.1), _percentile(s, 0.9), len(s))


def pooled(samples_us: dict[str, list[float]], sep: str = "#") -> dict[str, Stats]:
    """Stats of samples pooled by the key's part before ``sep``: ``{"a#0": .., "a#1": ..}``
    -> ``{"a": Stats of both}``. Times of one variant on several input allocations, so that no
    one allocation's physical placement (DRAM channels, L2 slices) decides its median."""
    groups: dict[str, list[float]] = {}
    for key, vals in samples_us.items():
        groups.setdefault(key.split(sep, 1)[0], []).extend(vals)
    return {key: summarize(vals) for key, vals in groups.items()}


def interleaved_samples(
    fns: dict[str, Callable[[], object]],
    warmup: int = 10,
    iters: int = 50,
    flush_l2: bool = True,
) -> dict[str, list[float]]:
    """Per-call GPU times in microseconds of several variants taking turns, keyed like ``fns``."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    events = {
        k: [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(iters)
        ]
        for k in fns
    }
    for i in range(iters):
        for k, fn in fns.items():
            if flush_l2:
                _flush()
            torch.cuda._sleep(HEADROOM_CYCLES)
            start, end = events[k][i]
            start.record()
            fn()
            end.record()
    torch.cuda.synchronize()
    return {k: [s.elapsed_time(e) * 1000.0 for s, e in evs] for k, evs in events.items()}


def interleaved(
    fns: dict[str, Callable[[], object]],
    warmup: int = 10,
    iters: int = 50,
    flush_l2: bool = True,
) -> dict[str, Stats]:
    """Time several variants taking turns; returns per-variant Stats keyed like ``fns``."""
    samples = interleaved_samples(fns, warmup=warmup, iters=iters, flush_l2=flush_l2)
    return {k: summarize(v) for k, v in samples.items()}


def time_cuda(
    fn: Callable[[], object], warmup: int = 10, iters: int = 50, flush_l2: bool = True
) -> Stats:
    """GPU time of one callable (median over ``iters`` calls after ``warmup`` calls)."""
    return interleaved({"fn": fn}, warmup=warmup, iters=iters, flush_l2=flush_l2)["fn"]


def gbps(nbytes: int, stats: Stats) -> float:
    """Effective bandwidth in GB/s for ``nbytes`` moved in the median time."""
    return nbytes / (stats.median_us * 1e-6) / 1e9


@functools.cache
def copy_tbps() -> float:
    """The running GPU's device-to-device copy rate in TB/s (read + write bytes of a 1 GiB copy
    of random bytes, median of 20): the ceiling for memory-bound kernels, measured once a
    process (the H200 gave 4.3, about 90% of its 4.8 spec; an H100's is lower)."""
    n = 1 << 30
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    pair = [torch.empty_like(src), src]
    st = time_cuda(lambda: pair[0].copy_(pair[1]), warmup=5, iters=20, flush_l2=False)
    pair.clear()
    src = None
    torch.cuda.empty_cache()  # the 2 GiB go back to the driver, not to the next table's pool
    return 2 * n / (st.median_us * 1e-6) / 1e12


def pct_of_copy(nbytes: int, stats: Stats, ceiling_tbps: float | None = None) -> float:
    """Effective bandwidth as a percentage of the copy ceiling (default: ``copy_tbps()``)."""
    ceiling = copy_tbps() if ceiling_tbps is None else ceiling_tbps
    return 100.0 * gbps(nbytes, stats) / (ceiling * 1000.0)


def vs_torch_columns(stats: dict[str, Stats], nbytes: int) -> list[object]:
    """Table columns for a ``{"torch": ..., "cutile": ...}`` comparison: torch us, cuTile us,
    cuTile spread %, speedup, cuTile GB/s and % of the copy ceiling."""
    t, c = stats["torch"], stats["cutile"]
    return [
        t.median_us,
        c.median_us,
        c.spread_pct,
        f"{t.median_us / c.median_us:.2f}x",
        gbps(nbytes, c),
        pct_of_copy(nbytes, c),
    ]


def format_table(header: list[str], rows: list[list[object]]) -> str:
    """Fixed-width text table (right-aligned numbers) for benchmark output."""
    cells = [[f"{c:.1f}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)
    ]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)
