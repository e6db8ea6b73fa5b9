"""torch.profiler over one call in the model worker, held out of the experiment's reach as far
as one process allows.

Made before the experiment's code is imported: it keeps its own references to the profiler
class, the event splitter and the module-range hooks, and a snapshot of the namespaces the
profiler runs through (torch.profiler, torch.autograd and its profiler, torch._C._autograd,
torch.cuda's synchronize, this package's profiling modules). Before and after every profiled
call the namespaces must still hold the very objects of the snapshot, and while the call runs a
profile function (``sys.setprofile``, every thread where Python allows it) watches for calls of
the profiler's control functions (start, stop, prepare, step): code that stops the profiler to
drop a window of kernels, or starts its own, is caught in the act. A violation ends the worker
as refused (``ProfilerTampered``). What one process cannot prevent is listed in DESIGN.md,
"Worker confinement".
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

#: Namespaces whose entries the profiled call must leave as they were.
WATCHED_MODULES = (
    "torch.profiler",
    "torch.profiler.profiler",
    "torch.autograd",
    "torch.autograd.profiler",
    "torch.autograd.profiler_util",
    "torch._C._autograd",
    "torch.cuda",
    "tilegym_hf_bench.profiling.torch_trace",
    "tilegym_hf_bench.profiling.module_ranges",
    "tilegym_hf_bench.profiling.guarded",
)
#: torch._C._autograd functions only the harness may call while a profiled call runs.
CONTROL_FUNCTIONS = (
    "_enable_profiler",
    "_disable_profiler",
    "_prepare_profiler",
    "_kineto_step",
    "_enable_profiler_legacy",
    "_disable_profiler_legacy",
)


class ProfilerTampered(Exception):
    """The experiment reached into the profiler; the run is refused."""


def _snapshot(names) -> dict[str, dict[str, object]]:
    """The callables (functions, classes, builtins) of each namespace, held: their state
    (``torch.cuda._initialized`` and the like) changes as CUDA starts, their identity must
    not."""
    return {
        name: {k: v for k, v in vars(sys.modules[name]).items() if callable(v)} for name in names
    }


def _changes(before: dict[str, dict[str, object]]) -> list[str]:
    changed = []
    for name, entries in before.items():
        now = vars(sys.modules[name])
        for key, value in entries.items():
            if now.get(key) is not value:
                changed.append(f"{name}.{key}")
    return changed


class GuardedProfiler:
    def __init__(self):
        import torch
        import torch.autograd.profiler  # noqa: F401  (imported so its namespace is watched)
        import torch.autograd.profiler_util  # noqa: F401
        import torch.profiler.profiler  # noqa: F401

        from tilegym_hf_bench.profiling import module_ranges as ranges_module
        from tilegym_hf_bench.profiling import torch_trace

        self._profile = torch.profiler.profile
        self._activities = [
            torch.profiler.ProfilerActivity.CPU,
            torch.profiler.ProfilerActivity.CUDA,
        ]
        self._sync = torch.cuda.synchronize
        self._split = torch_trace.split_events
        self._ranges = ranges_module.module_ranges
        autograd_c = torch._C._autograd
        self._control = {
            id(getattr(autograd_c, n)): n for n in CONTROL_FUNCTIONS if hasattr(autograd_c, n)
        }
        self._names = tuple(n for n in WATCHED_MODULES if n in sys.modules)
        self._before = _snapshot(self._names)
        self._setprofile = sys.setprofile
        self._set_all = getattr(threading, "setprofile_all_threads", None) or threading.setprofile

    def _check(self, when: str) -> None:
        changed = _changes(self._before)
        if changed:
            raise ProfilerTampered(
                f"{when}: the profiler's namespaces were changed ({', '.join(changed[:5])})"
            )

    def record(self, model, call: Callable[[], object]) -> dict:
        """Profile ``call`` once; the raw kernels, host events and module ranges as plain lists
        (the caller classifies and attributes them)."""
        self._check("before the profiled call")
        seen: list[str] = []
        control = self._control

        def watch(frame, event, arg):
            if event == "c_call" and id(arg) in control:
                seen.append(f"{control[id(arg)]} called from {frame.f_code.co_filename}")

        self._sync()
        with self._ranges(model), self._profile(activities=self._activities) as prof:
            self._set_all(watch)
            self._setprofile(watch)
            try:
                call()
                self._sync()
            finally:
                self._setprofile(None)
                self._set_all(None)
        self._check("after the profiled call")
        if seen:
            raise ProfilerTampered(f"profiler control inside the profiled call: {seen[0]}")
        kernels, hosts, ranges = self._split(prof.profiler.kineto_results.events())
        return {
            "kernels": [[k.name, k.duration_ns, k.link_id, k.start_ns] for k in kernels],
            "hosts": [[h.id, h.thread, h.start_ns] for h in hosts],
            "ranges": [[r.module, r.thread, r.start_ns, r.end_ns] for r in ranges],
        }
