"""Forward hooks that wrap every submodule's forward in a named profiler range.

With torch.profiler the range is a ``record_function`` (a user annotation); with Nsight
Systems it is an NVTX range. The name is ``MODULE_RANGE_PREFIX + qualified name``.
"""

from __future__ import annotations

import contextlib

import torch

from tilegym_hf_bench.profiling.attribution import MODULE_RANGE_PREFIX


def module_name(root: torch.nn.Module, qualname: str) -> str:
    return qualname if qualname else type(root).__name__


@contextlib.contextmanager
def module_ranges(root: torch.nn.Module, kind: str = "record_function"):
    """Push a range named after each module on entry to its forward, pop it on exit."""
    handles = []
    open_ranges: dict[int, list] = {}

    def make_hooks(name: str):
        label = MODULE_RANGE_PREFIX + name

        def pre_hook(module, args):
            if kind == "nvtx":
                torch.cuda.nvtx.range_push(label)
            else:
                rf = torch.profiler.record_function(label)
                rf.__enter__()
                open_ranges.setdefault(id(module), []).append(rf)

        def post_hook(module, args, output):
            if kind == "nvtx":
                torch.cuda.nvtx.range_pop()
            else:
                open_ranges[id(module)].pop().__exit__(None, None, None)

        return pre_hook, post_hook

    try:
        for qualname, module in root.named_modules():
            pre, post = make_hooks(module_name(root, qualname))
            handles.append(module.register_forward_pre_hook(pre))
            handles.append(module.register_forward_hook(post, always_call=True))
        yield
    finally:
        for h in handles:
            h.remove()
