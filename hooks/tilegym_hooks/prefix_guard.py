"""Prefix guard: every coverage prefix names a cuTile kernel defined under ``src/tilegym``.

The rule is ``tilegym_hf_bench.profiling.cutile_names`` (the classifier's own): a prefix that is
not a cuTile kernel's name would widen the cuTile count to other kernels, and one that is a
kernel named like Inductor's or a vendor's (``triton_poi_fused_..._3``) would claim that kernel.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tilegym_hf_bench.profiling.cutile_names import prefix_problem, scan_kernel_names

from tilegym.findings import Finding
from tilegym_hooks.paths import KERNEL_SOURCE_ROOT, PREFIXES_YAML
from tilegym_hooks.prefix_file import parse_prefixes


def prefix_findings(data: bytes, kernel_names: Iterable[str], path: str) -> list[Finding]:
    """Findings for the prefix file ``data`` given the known kernel names (pure)."""
    parsed = parse_prefixes(data, path)
    known = frozenset(kernel_names)
    findings = list(parsed.findings)
    for prefix in parsed.prefixes:
        problem = prefix_problem(prefix.value, known)
        if problem is not None:
            where = "" if prefix.value in known else f" under {KERNEL_SOURCE_ROOT}"
            message = f"prefix {prefix.value!r} {problem}{where}"
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
