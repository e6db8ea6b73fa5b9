"""Records the ``tilegym`` custom ops a model calls: the inventory tests check that every op the
patched model calls has a Definition (on the CPU every cuTile op of the glue is one op)."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class OpCalls(TorchDispatchMode):
    """``calls``: (op name, args) of each ``tilegym`` op called inside the ``with`` block."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "tilegym":
            self.calls.append((func._opname, args))
        return func(*args, **(kwargs or {}))
