"""torch.profiler (CPU + CUDA activity) over one call, as plain attribution records."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch.autograd import DeviceType

from tilegym_hf_bench.profiling.attribution import (
    MODULE_RANGE_PREFIX,
    HostEvent,
    KernelEvent,
    ModuleRange,
)
from tilegym_hf_bench.profiling.module_ranges import module_ranges


class ProfilerError(Exception):
    """The profiler produced nothing usable."""


def profile_call(model: torch.nn.Module, call: Callable[[], object]):
    """Run ``call`` once under torch.profiler with module ranges on ``model``'s forwards;
    return (kernels, host events, module ranges)."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    torch.cuda.synchronize()
    with module_ranges(model), torch.profiler.profile(activities=activities) as prof:
        call()
        torch.cuda.synchronize()
    kernels, hosts, ranges = split_events(prof.profiler.kineto_results.events())
    if not kernels:
        raise ProfilerError("torch.profiler recorded no GPU kernel (is CUPTI usable here?)")
    return kernels, hosts, ranges


def _activity(event) -> str | None:
    """Kineto's activity type ("kernel", "cpu_op", "cuda_driver", ...), None on torch builds
    whose events do not expose it."""
    activity = getattr(event, "activity_type", None)
    return activity() if activity is not None else None


def _is_kernel(event) -> bool:
    """A kernel, not a memcpy/memset or a GPU-side copy of a user annotation."""
    activity = _activity(event)
    if activity is not None:
        return activity == "kernel"
    return not event.name().startswith(("Memcpy", "Memset", MODULE_RANGE_PREFIX))


#: Host-side CUDA API calls: kineto records the runtime and the driver API (cuTile, like
#: Triton, launches through the driver's cuLaunchKernel*).
LAUNCH_ACTIVITIES = ("cuda_runtime", "cuda_driver")
#: An API call's name (cudaLaunchKernel, cuLaunchKernelEx, cudaMemsetAsync, ...), for torch
#: builds whose events do not expose the activity type (torch 2.11 on the H200 does not)
_API_NAME = re.compile(r"cu(da)?[A-Z]\w*")


def _is_api_call(event) -> bool:
    """A CUDA runtime/driver API call: its correlation id is CUPTI's, not an op's."""
    activity = _activity(event)
    if activity is not None:
        return activity in LAUNCH_ACTIVITIES
    return _API_NAME.fullmatch(event.name()) is not None


def split_events(events) -> tuple[list[KernelEvent], list[HostEvent], list[ModuleRange]]:
    """Kineto events -> GPU kernels (each linked to the host event that launched it), host
    events, and our module ranges.

    A kernel launched inside a PyTorch op is linked to that op, as torch.profiler links them.
    Kineto links kernels only to ops, not to user annotations such as our module ranges, so a
    kernel launched outside any op (every cuTile launch: ``ct.launch`` is no op) has no linked
    op; it is linked instead to the runtime/driver call that launched it, which shares the
    kernel's CUPTI correlation id. Those ids and op ids are separate counters that can collide,
    so API calls enter as host events with the id negated. API calls are told apart by kineto's
    activity type, or by name where the build does not expose it.
    """
    kernels: list[KernelEvent] = []
    hosts: list[HostEvent] = []
    ranges: list[ModuleRange] = []
    for e in events:
        if e.device_type() == DeviceType.CUDA:
            if _is_kernel(e):
                link = e.linked_correlation_id() or -e.correlation_id()
                kernels.append(KernelEvent(e.name(), e.duration_ns(), link, e.start_ns()))
            continue
        name = e.name()
        if name.startswith(MODULE_RANGE_PREFIX):
            ranges.append(
                ModuleRange(
                    name[len(MODULE_RANGE_PREFIX) :], e.start_thread_id(), e.start_ns(), e.end_ns()
                )
            )
        if _is_api_call(e):
            hosts.append(HostEvent(-e.correlation_id(), e.start_thread_id(), e.start_ns()))
        # host ops and annotations carry their own id and no link
        elif e.correlation_id() > 0 and e.linked_correlation_id() == 0:
            hosts.append(HostEvent(e.correlation_id(), e.start_thread_id(), e.start_ns()))
    return kernels, hosts, ranges
