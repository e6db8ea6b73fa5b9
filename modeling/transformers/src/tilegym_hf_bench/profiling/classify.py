"""The classifier of the measured tree: its ``@ct.kernel`` names and its prefix list, read by
parsing (``experiment_tree``), applied by the one rule in ``cutile_names``."""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from pathlib import Path

import yaml

from tilegym_hf_bench.profiling.cutile_names import CutileNames

PREFIX_FILE = "tilegym_kernel_prefixes.yaml"


class PrefixFileError(Exception):
    """The prefix file is not ``prefixes: [<string>, ...]``."""


def parse_prefixes(text: str, source: str = PREFIX_FILE) -> tuple[str, ...]:
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or set(data) != {"prefixes"}:
        raise PrefixFileError(f"{source}: expected exactly one key 'prefixes'")
    prefixes = data["prefixes"]
    if prefixes is None:
        return ()
    if not isinstance(prefixes, list) or not all(isinstance(p, str) and p for p in prefixes):
        raise PrefixFileError(f"{source}: 'prefixes' must be a list of non-empty strings")
    return tuple(prefixes)


def load_prefixes(path: Path | None = None) -> tuple[str, ...]:
    """The bundled ``kernel_filters/tilegym_kernel_prefixes.yaml`` (or ``path``)."""
    if path is not None:
        return parse_prefixes(Path(path).read_text(), str(path))
    bundled = resources.files("tilegym_hf_bench").joinpath("kernel_filters", PREFIX_FILE)
    return parse_prefixes(bundled.read_text(), PREFIX_FILE)


class KernelClassifier(CutileNames):
    """``CutileNames`` with the benchmark's spelling: built from explicit names and prefixes."""

    def __init__(self, kernel_names: Iterable[str] = (), prefixes: Iterable[str] = ()):
        super().__init__(kernel_names, prefixes)

    def cutile_function(self, name: str) -> str | None:
        """The measured tree's ``@ct.kernel`` function behind a mangled symbol, or None."""
        function = self.demangled_function(name)
        return function if function in self.kernel_names else None
