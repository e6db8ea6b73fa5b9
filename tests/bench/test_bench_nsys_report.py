"""Reading an Nsight Systems SQLite export (the tables and columns nsys documents) into the
attribution records; the database here is written by the test in that layout."""

import sqlite3

import pytest
from tilegym_hf_bench.profiling.attribution import aggregate
from tilegym_hf_bench.profiling.classify import KernelClassifier
from tilegym_hf_bench.profiling.nsys_trace import NsysError, nsys_command, read_sqlite


def make_report(path, with_kernels=True):
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER, correlationId INTEGER, globalPid INTEGER,
            demangledName INTEGER, shortName INTEGER, mangledName INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
            eventClass INTEGER, globalTid INTEGER, correlationId INTEGER, nameId INTEGER);
        CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
            text TEXT, globalTid INTEGER, textId INTEGER);
        """
    )
    db.executemany(
        "INSERT INTO StringIds VALUES (?, ?)",
        [(1, "sm90_gemm_bf16"), (2, "gemm"), (3, "cuLaunchKernel"), (4, "tilegym.module:lm_head")],
    )
    tid = 0x01000000 | 77
    db.executemany(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId) "
        "VALUES (?,?,?,?,?,?)",
        [
            (100, 500, 59, "tilegym.module:model.layers.0.mlp", tid, None),
            (600, 900, 59, None, tid, 4),
            (0, 1000, 59, "unrelated range", tid, None),
            (50, None, 34, "a mark", tid, None),
        ],
    )
    db.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, globalTid, correlationId, nameId) "
        "VALUES (?,?,?,?,?)",
        [(200, 210, tid, 11, 3), (700, 705, tid, 12, 3)],
    )
    if with_kernels:
        db.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, correlationId, demangledName, "
            "shortName) VALUES (?,?,?,?,?)",
            [(1000, 4000, 11, 1, 2), (5000, 6000, 12, 1, 2)],
        )
    db.commit()
    db.close()


def test_kernels_link_to_nvtx_module_ranges(tmp_path):
    path = tmp_path / "report.sqlite"
    make_report(path)
    kernels, hosts, ranges = read_sqlite(path)
    assert {r.module for r in ranges} == {"model.layers.0.mlp", "lm_head"}
    cov = aggregate(kernels, hosts, ranges, KernelClassifier({"rms_norm_kernel"}).is_cutile)
    rows = {(r.name, r.module): (r.calls, r.gpu_ns) for r in cov.rows}
    assert rows == {
        ("sm90_gemm_bf16", "model.layers.*.mlp"): (1, 3000),
        ("sm90_gemm_bf16", "lm_head"): (1, 1000),
    }


def test_missing_or_empty_report_is_an_error(tmp_path):
    with pytest.raises(NsysError, match="no SQLite report"):
        read_sqlite(tmp_path / "absent.sqlite")
    path = tmp_path / "empty.sqlite"
    make_report(path, with_kernels=False)
    with pytest.raises(NsysError, match="no CUDA kernel"):
        read_sqlite(path)


def test_nsys_command_limits_capture_to_the_profiled_call(tmp_path):
    cmd = nsys_command("/usr/bin/nsys", tmp_path / "rep")
    assert cmd[:2] == ["/usr/bin/nsys", "profile"]
    assert "--capture-range=cudaProfilerApi" in cmd and "--export=sqlite" in cmd
    assert cmd[-2:] == ["--output", str(tmp_path / "rep")]
