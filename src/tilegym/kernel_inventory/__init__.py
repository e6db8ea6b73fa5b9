"""Kernel inventory: FlashInfer-Bench style Definitions and Solutions, and their gates.

Modules, one job each:

* ``schemas/`` + ``schema``  JSON Schemas (package files) and line-mapped validation
* ``jsonfile``     safe loading (size cap, binary, malformed, duplicate keys) + key lines
* ``models``       typed Definition / Solution records
* ``semantics``    rules beyond the schema (names, reference, permalinks, sources, entry point)
* ``permalink``    pure ``# Source:`` permalink parsing (also used by the pre-commit hooks)
* ``inventory``    discovery, pairing and loading of the files under ``src/tilegym/transformers``
* ``check``        ``tilegym-inventory check``; ``sources`` reads cited regions (--verify-sources)
* ``selection``    which Solutions a path selects (Solution, Definition, or any imported ``.py``)
* ``entry``        importing a Solution's entry module by path; one-line error text
* ``imports``      repository files a module imports (AST), for selection and cache keys
* ``compile``      AOT compile gate over ``aot_signatures()`` (cache, worker processes)
* ``parity``       runtime parity against the reference
* ``cache``        small locked JSON caches (permalinks, compiles)
* ``codes``        the table of finding codes (``tilegym-inventory codes`` prints it)

Public entry points for other tools::

    from tilegym.kernel_inventory import check_paths, compile_paths, parity_paths
    from tilegym.kernel_inventory import parse_permalink, iter_source_lines, leading_source_lines

Each returns plain data: ``list[Finding]`` (``tilegym.findings``) or, for the permalink helpers,
``Permalink | PermalinkError`` and ``SourceLine`` records; none of them raises on bad input.
"""

from tilegym.kernel_inventory.check import check_paths
from tilegym.kernel_inventory.codes import CODES
from tilegym.kernel_inventory.compile import compile_paths
from tilegym.kernel_inventory.parity import parity_paths
from tilegym.kernel_inventory.permalink import (
    Permalink,
    PermalinkError,
    SourceLine,
    iter_source_lines,
    leading_source_lines,
    parse_permalink,
)

__all__ = [
    "CODES",
    "Permalink",
    "PermalinkError",
    "SourceLine",
    "check_paths",
    "compile_paths",
    "parity_paths",
    "iter_source_lines",
    "leading_source_lines",
    "parse_permalink",
]
