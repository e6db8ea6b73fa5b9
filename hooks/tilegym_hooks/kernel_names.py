"""Names of the cuTile kernels (functions decorated ``@ct.kernel``) in Python source, by AST.

Nothing is imported: a kernel module may need a GPU toolchain to import, the guard must not.
Recognised decorators: ``@ct.kernel``, ``@cuda.tile.kernel``, either one called with options
(``@ct.kernel(num_ctas=2)``), and any alias the module binds with ``import cuda.tile as X`` or
``from cuda.tile import kernel as Y``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tilegym_hooks.paths import MAX_PARSED_BYTES

TILE_MODULE = "cuda.tile"


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


def scan_kernel_names(root: Path) -> set[str]:
    """Kernel names defined in the ``*.py`` files under ``root``; unparsable files are skipped.

    A file that does not parse is ruff's finding to make; it simply defines no kernel here.
    """
    names: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        try:
            if path.stat().st_size > MAX_PARSED_BYTES:
                continue
            source = path.read_text(encoding="utf-8")
            names.update(kernel_functions(source))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
            continue
    return names
