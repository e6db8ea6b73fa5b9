"""The model worker stays still while the PyTorch side is timed: stopped (SIGSTOP), and the GPU
waited on until NVML's samples show it idle, so GPU work the worker queued before its answer
cannot run beside the PyTorch side (on the H200 such a worker took the PyTorch side from ~250
to 131-162 tok/s before this existed)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from tilegym_hf_bench.gpu_activity import Sample, Silence, quiet_after
from tilegym_hf_bench.worker_client import ModelWorker

import tilegym

T0 = 1_000_000


def test_quiet_needs_a_whole_sample_period_after_the_stop():
    before = [Sample(T0 - 10, 0)]
    assert quiet_after(before, T0) is None
    assert quiet_after([*before, Sample(T0 + 5, 0)], T0) is None  # its period began before T0
    assert quiet_after([Sample(T0 + 5, 90), Sample(T0 + 9, 0)], T0) is True
    assert quiet_after([Sample(T0 + 9, 40), Sample(T0 + 5, 0)], T0) is False  # latest is busy


class Sampler:
    """Utilization samples from a script: ``busy_s`` of 100% after the first call, then 0."""

    def __init__(self, busy_s: float, period_s: float = 0.01, samples: bool = True):
        self.busy_s, self.period_s, self.samples = busy_s, period_s, samples
        self.start = None

    def samples_since(self, since_us: int) -> list[Sample]:
        now = time.time_ns() // 1000
        self.start = self.start or now
        if not self.samples:
            return []
        period = int(self.period_s * 1e6)
        stamps = range(since_us + period, now, period)
        return [Sample(t, 100 if t - self.start < self.busy_s * 1e6 else 0) for t in stamps]


def silence_with(sampler, limit_s: float) -> tuple[Silence, list[str]]:
    events: list[str] = []

    @contextmanager
    def freeze():
        events.append("stop")
        yield
        events.append("continue")

    silence = Silence(freeze, "cpu", limit_s=limit_s)
    silence.gpu, silence.unchecked = sampler, None
    return silence, events


def test_a_call_waits_for_queued_work_then_runs_with_the_worker_stopped():
    silence, events = silence_with(Sampler(busy_s=0.1), limit_s=2.0)
    with silence.around():
        events.append("timed")
    assert events == ["stop", "timed", "continue"]
    assert silence.problem is None
    assert 0.1 <= silence.waits[0] < 1.0
    assert "1 waits" in silence.summary()


def test_a_gpu_busy_past_the_limit_is_the_problem_that_refuses_the_run():
    silence, _ = silence_with(Sampler(busy_s=60), limit_s=0.2)
    with silence.around():
        pass
    assert "stayed busy for 0 s after the model worker was stopped" in silence.problem


def test_without_samples_the_wait_is_skipped_and_said():
    silence, _ = silence_with(Sampler(busy_s=0, samples=False), limit_s=0.1)
    with silence.around():
        pass
    assert silence.problem is None and silence.gpu is None
    assert "not checked (NVML returned no utilization samples)" in silence.summary()
    assert "not checked (no GPU)" in Silence(contextmanager(lambda: iter([None])), "cpu").summary()


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_a_real_worker_is_stopped_inside_the_window_and_runs_after(tmp_path):
    worker = ModelWorker(
        device="cpu",
        scratch=tmp_path,
        src_root=Path(tilegym.__file__).resolve().parent.parent,
        log=lambda line: None,
    )
    try:
        with worker.frozen():
            assert _state(worker.proc.pid) == "T"
        deadline = time.monotonic() + 5
        while _state(worker.proc.pid) == "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _state(worker.proc.pid) != "T"
    finally:
        worker.close()
