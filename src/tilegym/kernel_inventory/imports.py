"""Which repository files a Python file imports, transitively (parsed with ``ast``, not run).

The compile gate uses it twice: a changed ``src/tilegym/ops/*.py`` selects every Solution whose
entry module reaches it, and the compile cache key covers every file a kernel can depend on.
"""

from __future__ import annotations

import ast
from pathlib import Path

MAX_FILES = 500


def module_file(name: str, src_root: Path) -> Path | None:
    """``a.b.c`` -> ``src_root/a/b/c.py`` or ``.../c/__init__.py`` when it exists."""
    base = src_root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported_names(tree: ast.Module, package: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                module = ".".join([*parts, module] if module else parts)
            if not module:
                continue
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def local_dependencies(file: Path, src_root: Path) -> set[Path]:
    """Files under ``src_root`` that ``file`` imports, directly or through each other."""
    src_root = src_root.resolve()
    seen: set[Path] = set()
    todo = [file.resolve()]
    while todo and len(seen) < MAX_FILES:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            tree = ast.parse(current.read_bytes())
            relative = current.relative_to(src_root).with_suffix("")
        except (OSError, SyntaxError, ValueError, RecursionError):
            continue
        package = ".".join(relative.parts[:-1])
        for name in _imported_names(tree, package):
            pieces = name.split(".")
            for end in range(1, len(pieces) + 1):  # parents run their __init__ too
                target = module_file(".".join(pieces[:end]), src_root)
                if target is not None and target.resolve() not in seen:
                    todo.append(target.resolve())
    seen.discard(file.resolve())
    return seen
