"""Is a GPU kernel a cuTile kernel? Demangling first, the prefix list second."""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from pathlib import Path

import yaml

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


def _demangler():
    try:
        from cuda.tile.compilation import demangle_kernel_name
    except ImportError:
        return None
    return demangle_kernel_name


class KernelClassifier:
    """A kernel is cuTile when cuTile's demangler accepts its symbol (the names cuTile gives its
    kernels) or when it starts with one of the listed ``@ct.kernel`` function names (for
    profilers that shorten symbols)."""

    def __init__(self, prefixes: Iterable[str] = ()):
        self.prefixes = tuple(prefixes)
        self._demangle = _demangler()
        self._cache: dict[str, bool] = {}

    @property
    def can_demangle(self) -> bool:
        return self._demangle is not None

    def cutile_function(self, name: str) -> str | None:
        """The ``@ct.kernel`` function name behind a mangled symbol, or None."""
        if self._demangle is None:
            return None
        try:
            function, _signature = self._demangle(name)
        except Exception:  # the demangler rejects foreign names with several exception types
            return None
        return function

    def is_cutile(self, name: str) -> bool:
        hit = self._cache.get(name)
        if hit is None:
            hit = self.cutile_function(name) is not None or name.startswith(self.prefixes)
            self._cache[name] = hit
        return hit
