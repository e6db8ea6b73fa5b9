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


class ImportGraph:
    """The repository files each file imports, every file parsed at most once.

    One graph lives for one command: selecting Solutions for N changed files and hashing each
    kernel's dependencies then parse each repository file once, not once per query (the
    pre-commit hook passes ~100 files; a scan per file took ~9 s each on a 2-core machine).
    """

    def __init__(self, src_root: Path):
        self.src_root = src_root.resolve()
        self._direct: dict[Path, set[Path]] = {}
        self._closure: dict[Path, frozenset[Path]] = {}

    def direct(self, file: Path) -> set[Path]:
        """Files under ``src_root`` that ``file`` (resolved) imports itself."""
        cached = self._direct.get(file)
        if cached is not None:
            return cached
        targets: set[Path] = set()
        try:
            tree = ast.parse(file.read_bytes())
            relative = file.relative_to(self.src_root).with_suffix("")
        except (OSError, SyntaxError, ValueError, RecursionError):
            self._direct[file] = targets
            return targets
        package = ".".join(relative.parts[:-1])
        for name in _imported_names(tree, package):
            pieces = name.split(".")
            for end in range(1, len(pieces) + 1):  # parents run their __init__ too
                target = module_file(".".join(pieces[:end]), self.src_root)
                if target is not None:
                    targets.add(target.resolve())
        self._direct[file] = targets
        return targets

    def dependencies(self, file: Path) -> set[Path]:
        """Files under ``src_root`` that ``file`` imports, directly or through each other."""
        start = file.resolve()
        cached = self._closure.get(start)
        if cached is None:
            seen: set[Path] = set()
            todo = [start]
            while todo and len(seen) < MAX_FILES:
                current = todo.pop()
                if current in seen:
                    continue
                seen.add(current)
                todo.extend(t for t in self.direct(current) if t not in seen)
            seen.discard(start)
            cached = self._closure[start] = frozenset(seen)
        return set(cached)


def local_dependencies(file: Path, src_root: Path) -> set[Path]:
    """Files under ``src_root`` that ``file`` imports, directly or through each other."""
    return ImportGraph(src_root).dependencies(file)
