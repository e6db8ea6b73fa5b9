"""Coverage through Nsight Systems: the supervisor starts the worker under ``nsys profile``
(capture limited to the cudaProfilerApi range), the worker wraps one generate() in that range
with NVTX module ranges, and after the worker exits the supervisor reads the SQLite export.

The SQLite side is torch-free: kernels (CUPTI_ACTIVITY_KIND_KERNEL) link to their launching API
call (CUPTI_ACTIVITY_KIND_RUNTIME, runtime and driver calls alike) by correlationId; module
ranges are the NVTX push/pop ranges named ``MODULE_RANGE_PREFIX + module``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tilegym_hf_bench.profiling.attribution import (
    MODULE_RANGE_PREFIX,
    HostEvent,
    KernelEvent,
    ModuleRange,
)

NVTX_PUSH_POP_RANGE = 59


class NsysError(Exception):
    """The Nsight Systems report is missing or has no kernel."""


def nsys_command(nsys: str, report_base: str | Path) -> list[str]:
    """The prefix that runs the worker under nsys and exports SQLite at the end."""
    return [
        nsys, "profile", "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none",
        "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
        "--force-overwrite=true", "--export=sqlite", "--output", str(report_base),
    ]  # fmt: skip


def profile_call(model, call) -> None:
    """Worker side: one call inside cudaProfilerStart/Stop with NVTX module ranges."""
    import torch

    from tilegym_hf_bench.profiling.module_ranges import module_ranges

    torch.cuda.synchronize()
    with module_ranges(model, kind="nvtx"):
        torch.cuda.profiler.start()
        try:
            call()
            torch.cuda.synchronize()
        finally:
            torch.cuda.profiler.stop()


def _tables(db: sqlite3.Connection) -> set[str]:
    return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def read_sqlite(path: str | Path) -> tuple[list[KernelEvent], list[HostEvent], list[ModuleRange]]:
    if not Path(path).is_file():
        raise NsysError(f"Nsight Systems wrote no SQLite report at {path}")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = _tables(db)
        if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
            raise NsysError(f"{path}: no CUDA kernel was captured")
        name_col = (
            "demangledName"
            if "demangledName" in _columns(db, "CUPTI_ACTIVITY_KIND_KERNEL")
            else "shortName"
        )
        kernels = [
            KernelEvent(name, end - start, corr, start)
            for name, start, end, corr in db.execute(
                "SELECT s.value, k.start, k.end, k.correlationId "
                f"FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.{name_col}"
            )
        ]
        hosts = []
        if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
            hosts = [
                HostEvent(corr, tid, start)
                for corr, tid, start in db.execute(
                    "SELECT correlationId, globalTid, start FROM CUPTI_ACTIVITY_KIND_RUNTIME"
                )
            ]
        ranges = []
        if "NVTX_EVENTS" in tables:
            query = (
                "SELECT COALESCE(e.text, s.value), e.globalTid, e.start, e.end "
                "FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                "WHERE e.eventType = ? AND e.end IS NOT NULL"
            )
            for text, tid, start, end in db.execute(query, (NVTX_PUSH_POP_RANGE,)):
                if text and text.startswith(MODULE_RANGE_PREFIX):
                    ranges.append(ModuleRange(text[len(MODULE_RANGE_PREFIX) :], tid, start, end))
    finally:
        db.close()
    if not kernels:
        raise NsysError(f"{path}: no CUDA kernel was captured")
    return kernels, hosts, ranges
