"""Import a Solution's entry module by its repository path, and word errors in one line."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

FILE_MODULE_PREFIX = "_tilegym_entry_"
"""Module-name prefix of entry files imported by path (outside an importable package)."""


def import_entry_module(entry_path: Path, repo_root: Path) -> ModuleType:
    """Import the entry file by package name when it lives in an importable package."""
    entry_path = entry_path.resolve()
    name = _package_module_name(entry_path, repo_root)
    if name is not None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin and Path(spec.origin).resolve() == entry_path:
            return importlib.import_module(name)
    digest = hashlib.sha256(str(entry_path).encode()).hexdigest()[:12]
    module_name = f"{FILE_MODULE_PREFIX}{entry_path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, entry_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {entry_path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def _package_module_name(entry_path: Path, repo_root: Path) -> str | None:
    src = (repo_root / "src").resolve()
    try:
        relative = entry_path.relative_to(src)
    except ValueError:
        return None
    parts = list(relative.with_suffix("").parts)
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


_LOCATION = re.compile(r'^\s*"(?P<file>[^"]+)", line (?P<line>\d+)')


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` plus the kernel source location when cuTile gives one."""
    text = str(exc)
    lines = text.splitlines()
    head = lines[0].strip() if lines else ""
    where = ""
    for line in lines[1:3]:
        match = _LOCATION.match(line)
        if match:
            where = f" (at {Path(match.group('file')).name}:{match.group('line')})"
            break
    return f"{type(exc).__name__}: {head}{where}" if head else type(exc).__name__
