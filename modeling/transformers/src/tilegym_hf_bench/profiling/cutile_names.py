"""The one rule for "is this GPU kernel cuTile?", shared by the prefix guard, the benchmark's
classifier and the bot's recomputation of coverage.

A profiled kernel is cuTile only when it is the launch of a ``@ct.kernel`` function defined in
the measured tree: cuTile's demangler splits the symbol into ``<function>_K<conv>_<params>``,
and ``<function>`` must be one of the tree's kernel functions, found by parsing (never by
importing: a kernel module may need a GPU toolchain to import, and the tree may be untrusted).
A listed prefix adds names a profiler shortens; it must itself be such a function and matches
only that name or that name followed by cuTile's ``_K`` mangling, never a longer identifier or
a C++ signature (a kernel called ``void`` must not claim every ``void at::native::...``).

Recognised decorators: ``@ct.kernel``, ``@cuda.tile.kernel``, either one called with options
(``@ct.kernel(num_ctas=2)``), and any alias the module binds with ``import cuda.tile as X`` or
``from cuda.tile import kernel as Y``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

TILE_MODULE = "cuda.tile"
MANGLING_MARK = "_K"
# Files larger than this are not parsed (a guard reports them instead of spending minutes).
MAX_PARSED_BYTES = 2 * 1024 * 1024


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _kernel_decorator_names(tree: ast.Module) -> set[str]:
    """Dotted decorator spellings that mean ``cuda.tile.kernel`` in this module."""
    names = {"ct.kernel", f"{TILE_MODULE}.kernel"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == TILE_MODULE and alias.asname:
                    names.add(f"{alias.asname}.kernel")
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                bound = alias.asname or alias.name
                if node.module == TILE_MODULE and alias.name == "kernel":
                    names.add(bound)
                elif node.module == "cuda" and alias.name == "tile":
                    names.add(f"{bound}.kernel")
    return names


def kernel_functions(source: str) -> Iterator[str]:
    """Yield the name of every function in ``source`` decorated as a cuTile kernel.

    Raises SyntaxError/ValueError for source that does not parse.
    """
    tree = ast.parse(source)
    decorators = _kernel_decorator_names(tree)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            if _dotted(target) in decorators:
                yield node.name
                break


def names_in_sources(sources: Iterable[bytes]) -> frozenset[str]:
    """Kernel names defined in Python sources; an unparsable or oversized one defines none
    (ruff reports it; here it simply adds no kernel)."""
    names: set[str] = set()
    for data in sources:
        if len(data) > MAX_PARSED_BYTES:
            continue
        try:
            names.update(kernel_functions(data.decode("utf-8")))
        except (UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
            continue
    return frozenset(names)


def scan_kernel_names(root: Path) -> frozenset[str]:
    """Kernel names defined in the ``*.py`` files under ``root`` (a checkout's src/tilegym)."""

    def sources() -> Iterator[bytes]:
        for path in sorted(root.rglob("*.py")):
            try:
                if path.stat().st_size <= MAX_PARSED_BYTES:
                    yield path.read_bytes()
            except OSError:
                continue

    return names_in_sources(sources())


def prefix_problem(prefix: str, kernel_names: Iterable[str]) -> str | None:
    """Why ``prefix`` may not widen the cuTile count, or None when it is a kernel's name."""
    if prefix not in set(kernel_names):
        return "names no @ct.kernel function"
    return None


def _demangler():
    try:
        from cuda.tile.compilation import demangle_kernel_name
    except ImportError:
        return None
    return demangle_kernel_name


class CutileNames:
    """The rule above for one measured tree: its kernel names and its listed prefixes."""

    def __init__(self, kernel_names: Iterable[str], prefixes: Iterable[str] = ()):
        self.kernel_names = frozenset(kernel_names)
        self.prefixes = frozenset(
            p for p in prefixes if prefix_problem(p, self.kernel_names) is None
        )
        self._demangle = _demangler()
        self._cache: dict[str, bool] = {}

    @property
    def can_demangle(self) -> bool:
        return self._demangle is not None

    def demangled_function(self, name: str) -> str | None:
        """The function name cuTile's demangler reads from ``name`` (whatever tree), or None."""
        if self._demangle is None:
            return None
        try:
            function, signature = self._demangle(name)
        except Exception:  # the demangler rejects foreign names with several exception types
            return None
        return function if signature.parameters else None

    def _by_prefix(self, name: str) -> bool:
        return any(name == p or name.startswith(p + MANGLING_MARK) for p in self.prefixes)

    def is_cutile(self, name: str) -> bool:
        hit = self._cache.get(name)
        if hit is None:
            hit = self.demangled_function(name) in self.kernel_names or self._by_prefix(name)
            self._cache[name] = hit
        return hit
