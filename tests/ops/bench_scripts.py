"""A benchmark script of ``benchmarks/ops`` imported as a module, for tests of its CPU side
(the scripts import their siblings, ``_timing`` and the like, by plain name)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "ops"


def load_bench(name: str):
    """``benchmarks/ops/<name>.py`` as a fresh module."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH))
    return mod
