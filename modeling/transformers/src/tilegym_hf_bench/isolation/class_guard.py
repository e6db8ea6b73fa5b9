"""Class rebinding the audit hook cannot see, caught by comparison.

CPython raises no audit event for an ordinary attribute set on a class (``A.forward = f``,
``setattr(A, ...)``, ``unittest.mock.patch.object``): only special attributes are audited. So
the worker snapshots, before the experiment's code is imported, every attribute of the classes
a verdict runs through — the model family's upstream modeling module, transformers' generation
and cache classes, the profiler, this harness — and compares after every
request. A class attribute that now holds another object, or is gone, ends the run as refused.
(Rebinding the worker's own model classes would only change the worker's own output, which is
scored outside it; refusing it keeps the rule the scope guard states, SCOPE014.)
``torch.nn.Module`` is not watched: Dynamo itself rebinds its ``__init__`` and
``__setstate__`` on the first compile.
"""

from __future__ import annotations

import sys

#: Modules (prefixes) whose classes are watched besides the family's upstream module.
WATCHED_PREFIXES = (
    "transformers.generation.",
    "transformers.cache_utils",
    "transformers.modeling_utils",
    "torch.profiler",
    "torch.autograd.profiler",
    "tilegym_hf_bench",
)


def _watched(name: str, extra: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p) for p in (*WATCHED_PREFIXES, *extra))


def _classes(module) -> list[type]:
    return [
        v
        for v in vars(module).values()
        if isinstance(v, type) and getattr(v, "__module__", None) == module.__name__
    ]


class ClassGuard:
    def __init__(self, extra_modules: tuple[str, ...] = ()):
        self._extra = tuple(extra_modules)
        self._held: dict[tuple[str, str], dict[str, object]] = {}
        self._types: dict[tuple[str, str], type] = {}
        self.snapshot()

    def watch(self, *modules: str) -> None:
        """Watch these modules' classes too (the model's own modeling module, known once the
        harness built the model: before any experiment code is imported)."""
        self._extra = (*self._extra, *modules)

    def snapshot(self) -> None:
        """Record the watched classes loaded now (call again after importing more of them:
        classes already recorded keep their first record)."""
        for name, module in list(sys.modules.items()):
            if module is None or not _watched(name, self._extra):
                continue
            for cls in _classes(module):
                key = (name, cls.__qualname__)
                if key not in self._held:
                    self._types[key] = cls
                    # the objects themselves, held: an id could be reused once freed
                    self._held[key] = dict(vars(cls))

    def changes(self) -> list[str]:
        """``module.Class.attribute`` for every watched class attribute rebound or deleted
        since its snapshot (new attributes are not counted: caches and lazy members)."""
        changed = []
        for key, before in self._held.items():
            now = vars(self._types[key])
            for attr, value in before.items():
                if attr not in now or now[attr] is not value:
                    changed.append(f"{key[0]}.{key[1]}.{attr}")
        return changed
