"""Prefix guard: every coverage prefix names a cuTile kernel defined under ``src/tilegym``.

The coverage filter counts a profiled kernel as cuTile when its name starts with a listed
prefix; a prefix that is not a cuTile kernel's name would widen that count to other kernels.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tilegym.findings import Finding
from tilegym_hooks.kernel_names import scan_kernel_names
from tilegym_hooks.paths import KERNEL_SOURCE_ROOT, PREFIXES_YAML
from tilegym_hooks.prefix_file import parse_prefixes


def prefix_findings(data: bytes, kernel_names: Iterable[str], path: str) -> list[Finding]:
    """Findings for the prefix file ``data`` given the known kernel names (pure)."""
    parsed = parse_prefixes(data, path)
    known = set(kernel_names)
    findings = list(parsed.findings)
    for prefix in parsed.prefixes:
        if prefix.value not in known:
            message = (
                f"prefix {prefix.value!r} names no @ct.kernel function under {KERNEL_SOURCE_ROOT}"
            )
            findings.append(Finding(path, prefix.line, "PREFIX005", message))
    return findings


def check_prefixes(repo_root: Path) -> list[Finding]:
    """Read the prefix file and scan the kernel sources of the checkout at ``repo_root``."""
    try:
        data = (repo_root / PREFIXES_YAML).read_bytes()
    except FileNotFoundError:
        return [Finding(PREFIXES_YAML, 1, "PREFIX000", "file not found")]
    except OSError as exc:
        return [Finding(PREFIXES_YAML, 1, "PREFIX000", f"cannot read: {exc.strerror}")]
    return prefix_findings(data, scan_kernel_names(repo_root / KERNEL_SOURCE_ROOT), PREFIXES_YAML)
