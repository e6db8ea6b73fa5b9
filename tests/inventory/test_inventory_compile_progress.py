"""The AOT compile gate on a slow machine: each compile is cached as it finishes (a stopped run
keeps its work), one progress line per compile, and a limit that scales with the work (it gives
up only when no compile has finished for a while) and stops the worker processes when it does.
Real tiny cuTile kernels, real worker processes."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from inventory_helpers import make_tree
from test_inventory_compile import ENTRY, GOOD_KERNEL, HEADER, SIGNATURES

from tilegym.kernel_inventory.compile import compile_paths, toolchain_problem

pytestmark = pytest.mark.skipif(
    toolchain_problem() is not None, reason=f"no cuTile compile toolchain: {toolchain_problem()}"
)


class Stop(Exception):
    """Stands in for Ctrl-C or a killed run, raised from the progress callback."""


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEGYM_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "repo"
    make_tree(root, kernel_source=HEADER + GOOD_KERNEL + ENTRY + SIGNATURES)
    return root


def _cached(tmp_path) -> list[str]:
    path = tmp_path / "cache" / "aot_compiles.json"
    return sorted(v["gpu_code"] for v in json.loads(path.read_text()).values())


def _no_workers_left() -> bool:
    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not multiprocessing.active_children()


def test_a_stopped_run_keeps_each_finished_compile_and_the_next_run_continues(tmp_path, root):
    lines = []

    def stop_after_the_first(line: str) -> None:
        lines.append(line)
        raise Stop

    with pytest.raises(Stop):
        compile_paths([], root, jobs=2, progress=stop_after_the_first)
    assert _no_workers_left()
    (first,) = lines
    assert first.startswith("aot compile 1/3: mul_kernel for SM")
    assert ": ok in " in first
    done = _cached(tmp_path)
    assert len(done) == 1 and done[0] in first

    lines.clear()
    assert compile_paths([], root, jobs=2, progress=lines.append) == []
    assert [line.split(":")[0] for line in lines] == ["aot compile 1/2", "aot compile 2/2"]
    assert _cached(tmp_path) == ["sm_100", "sm_120", "sm_90"]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_stall_names_what_is_left_and_stops_the_workers(root, jobs):
    t0 = time.monotonic()
    findings = compile_paths([], root, jobs=jobs, stall_s=0.0)
    assert time.monotonic() - t0 < 60
    assert _no_workers_left()
    assert len(findings) == 3
    assert all(
        "not compiled: no compile finished for 0 s, so the gate stopped with 3 of 3 compiles "
        "left (the finished ones are cached: run it again to continue)" in f.message
        for f in findings
    )


@pytest.mark.parametrize("jobs", [1, 2])
def test_compiles_that_keep_finishing_are_never_stopped(tmp_path, root, jobs):
    """The limit is per compile, not for the whole run: each finished compile restarts it."""
    lines = []
    assert compile_paths([], root, jobs=jobs, stall_s=120.0, progress=lines.append) == []
    assert len(lines) == 3 and _no_workers_left()
    assert _cached(tmp_path) == ["sm_100", "sm_120", "sm_90"]


def _children(pid: int) -> set[int]:
    """Processes whose parent is ``pid`` (from /proc)."""
    out = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines())
        except (OSError, ValueError):
            continue
        if fields.get("PPid", "").strip() == str(pid):
            out.add(int(status.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_sigterm_stops_the_run_and_its_workers(root):
    """A time limit's ``timeout`` sends SIGTERM: the gate must not leave its workers running."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "tilegym.kernel_inventory.cli", "compile", "--jobs", "2"]
    proc = subprocess.Popen(
        [*command, "--repo-root", str(root)], stderr=subprocess.PIPE, text=True, env=env
    )
    workers: set[int] = set()
    try:
        first = proc.stderr.readline()
        assert first.startswith("aot compile 1/3: "), first
        workers = _children(proc.pid)
        assert workers, "no worker processes while compiles are left"
        proc.send_signal(signal.SIGTERM)
        try:
            _, rest = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("stderr still open 60 s after SIGTERM: workers outlived the gate")
        assert proc.returncode == 143
        assert rest.strip().splitlines()[-1] == "error: terminated (SIGTERM)"
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in workers)
    finally:  # a failed run leaves nothing behind either
        proc.kill()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
