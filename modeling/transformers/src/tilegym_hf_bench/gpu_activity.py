"""GPU work of the model worker while this process times the PyTorch side.

The worker is stopped (SIGSTOP) while the PyTorch side is timed, so none of its threads can
launch anything then. What it queued on the GPU just before would still run beside the
PyTorch side and slow it (measured on the H200: a worker that queued a second of spinning
after each answer took the PyTorch side from ~250 to 131-162 tok/s), which raises the
cuTile/PyTorch ratio a verdict reads. So after stopping the worker this process waits until
NVML's device utilization samples show the GPU idle (this process has nothing queued then:
every earlier request was answered), and a GPU that stays busy longer than ``QUIET_LIMIT_S``
fails the run. Without NVML (no ``pynvml``, a CPU run) the wait is skipped and the log says
why.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

QUIET_LIMIT_S = 5.0  # an honest worker leaves nothing queued: its answers are synchronized
POLL_S = 0.01


@dataclass(frozen=True)
class Sample:
    timestamp_us: int
    percent: int


def quiet_after(samples: list[Sample], since_us: int) -> bool | None:
    """Whether the GPU was idle through the latest sample whose whole period lies after
    ``since_us`` (a sample's value covers the period since the one before it): True or False,
    None while no such sample exists yet."""
    after = sorted((s for s in samples if s.timestamp_us > since_us), key=lambda s: s.timestamp_us)
    if len(after) < 2:
        return None
    return after[-1].percent == 0


def now_us() -> int:
    """NVML's sample timestamps are CPU wall-clock microseconds."""
    return time.time_ns() // 1000


class DeviceUtilization:
    """NVML's utilization samples of one GPU, named by its UUID (CUDA's device order and
    NVML's can differ)."""

    def __init__(self, uuid: str):
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        name = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        self._handle = pynvml.nvmlDeviceGetHandleByUUID(name)

    def samples_since(self, since_us: int) -> list[Sample]:
        nvml = self._nvml
        try:
            _, raw = nvml.nvmlDeviceGetSamples(
                self._handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, since_us
            )
        except nvml.NVMLError_NotFound:  # no sample since then yet
            return []
        return [Sample(int(s.timeStamp), int(s.sampleValue.uiVal)) for s in raw]


def open_utilization(device: str) -> tuple[DeviceUtilization | None, str | None]:
    """(the sampler, None) for a CUDA device, else (None, why the wait cannot run)."""
    if not device.startswith("cuda"):
        return None, "no GPU"
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(torch.device(device)).uuid)
        return DeviceUtilization(uuid), None
    except ImportError:
        return None, "pynvml (nvidia-ml-py) is not installed"
    except Exception as exc:  # NVMLError subclasses: no library, no permission, no support
        return None, f"NVML: {type(exc).__name__}: {exc}"


class Silence:
    """Around each timed call of this process's side: stop the worker (``freeze()``, a context
    manager), wait for a quiet GPU, time. ``problem`` is set when the GPU stayed busy past
    the limit; the runner refuses the run then."""

    def __init__(self, freeze: Callable, device: str, limit_s: float = QUIET_LIMIT_S):
        self._freeze = freeze
        self.limit_s = limit_s
        self.gpu, self.unchecked = open_utilization(device)
        self.waits: list[float] = []
        self.problem: str | None = None

    @contextmanager
    def around(self):
        with self._freeze():
            if self.gpu is not None:
                self._wait_quiet()
            yield

    def _wait_quiet(self) -> None:
        start = now_us()
        deadline = time.monotonic() + self.limit_s
        while True:
            quiet = quiet_after(self.gpu.samples_since(start), start)
            if quiet:
                self.waits.append((now_us() - start) / 1e6)
                return
            if time.monotonic() > deadline:
                if quiet is None:  # the driver keeps no samples: nothing to wait on
                    self.gpu, self.unchecked = None, "NVML returned no utilization samples"
                elif self.problem is None:
                    self.problem = (
                        f"the GPU stayed busy for {self.limit_s:.0f} s after the model worker "
                        "was stopped, with nothing of this process queued: work the worker "
                        "queued before its answer runs while the PyTorch side is timed"
                    )
                return
            time.sleep(POLL_S)

    def summary(self) -> str:
        head = "quiet GPU before each timed PyTorch call (model worker stopped)"
        if self.gpu is None:
            return f"{head}: not checked ({self.unchecked})"
        if not self.waits:
            return f"{head}: " + ("never quiet" if self.problem else "no call")
        return (
            f"{head}: {len(self.waits)} waits, median {statistics.median(self.waits):.2f} s, "
            f"longest {max(self.waits):.2f} s"
        )
