"""What the measured tree says about itself, read by parsing, never by importing it.

The harness (this package) comes from the trusted tree; the code under test is the ``tilegym``
package first on the path (the experiment's ``src/``). Three things the experiment may change
live beside that package in its checkout: its model's entry in ``MODEL_PATCH_KWARGS``
(``tilegym_patch.py``), the coverage prefixes, and its ``@ct.kernel`` functions. They are read
from the experiment's files as data: a literal dict entry, YAML, and the parsed source.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tilegym_hf_bench.profiling.classify import KernelClassifier, PrefixFileError, parse_prefixes
from tilegym_hf_bench.profiling.cutile_names import scan_kernel_names

HARNESS_DIR = Path(__file__).resolve().parent
HARNESS_REL = Path("modeling/transformers/src/tilegym_hf_bench")
PATCH_FILE = HARNESS_REL / "tilegym_patch.py"
PREFIX_FILE = HARNESS_REL / "kernel_filters" / "tilegym_kernel_prefixes.yaml"
PATCH_KWARGS_NAME = "MODEL_PATCH_KWARGS"
#: Set by the supervisor for the trusted measuring process, which must not find (or import)
#: the measured ``tilegym`` itself: the ``src/`` folder holding it ("" when there is none).
MEASURED_SRC_ENV = "TILEGYM_MEASURED_SRC"


class ExperimentTreeError(Exception):
    """The experiment's data files cannot be read as data."""


@dataclass(frozen=True)
class ExperimentTree:
    """The measured tree: its ``tilegym`` package folder and, when it is a checkout, its root."""

    package_dir: Path | None
    root: Path | None

    def _file(self, rel: Path) -> Path:
        """The experiment's copy of ``rel`` when it has one, else the harness's own."""
        if self.root is not None and (self.root / rel).is_file():
            return self.root / rel
        return HARNESS_DIR / rel.relative_to(HARNESS_REL)

    def kernel_names(self) -> frozenset[str]:
        return scan_kernel_names(self.package_dir) if self.package_dir else frozenset()

    def prefixes(self) -> tuple[str, ...]:
        path = self._file(PREFIX_FILE)
        try:
            return parse_prefixes(path.read_text(encoding="utf-8"), str(path))
        except (OSError, UnicodeDecodeError) as exc:
            raise ExperimentTreeError(f"{path}: cannot read: {exc}") from None
        except PrefixFileError as exc:
            raise ExperimentTreeError(str(exc)) from None

    def classifier(self) -> KernelClassifier:
        return KernelClassifier(self.kernel_names(), self.prefixes())

    def patch_table(self) -> dict[str, Any]:
        return patch_table_from_source(self._file(PATCH_FILE))


def patch_table_from_source(path: Path) -> dict[str, Any]:
    """``MODEL_PATCH_KWARGS`` of a ``tilegym_patch.py`` as data: each entry must be a literal."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
        raise ExperimentTreeError(f"{path}: cannot parse: {exc}") from None
    for statement in tree.body:
        targets = statement.targets if isinstance(statement, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == PATCH_KWARGS_NAME for t in targets):
            if not isinstance(statement.value, ast.Dict):
                break
            table = {}
            for key, value in zip(statement.value.keys, statement.value.values, strict=True):
                try:
                    table[ast.literal_eval(key)] = ast.literal_eval(value)
                except (ValueError, TypeError, SyntaxError):
                    line = (value or key).lineno
                    raise ExperimentTreeError(
                        f"{path}:{line}: {PATCH_KWARGS_NAME} entries must be literals"
                    ) from None
            return table
    raise ExperimentTreeError(f"{path}: no {PATCH_KWARGS_NAME} = {{...}} dict literal")


def measured_tree() -> ExperimentTree:
    """Where the ``tilegym`` package that will be imported lives (found without importing it),
    or where the supervisor said it is."""
    given = os.environ.get(MEASURED_SRC_ENV)
    if given is not None:
        if not given or not (Path(given) / "tilegym").is_dir():
            return ExperimentTree(None, None)
        package = (Path(given) / "tilegym").resolve()
        root = package.parents[1] if package.parent.name == "src" else None
        return ExperimentTree(package, root)
    spec = importlib.util.find_spec("tilegym")
    if spec is None or not spec.submodule_search_locations:
        return ExperimentTree(None, None)
    package = Path(next(iter(spec.submodule_search_locations))).resolve()
    root = package.parents[1] if package.parent.name == "src" else None
    return ExperimentTree(package, root)
