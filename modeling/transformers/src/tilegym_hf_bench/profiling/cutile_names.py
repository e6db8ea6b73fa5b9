"""The one rule for "is this GPU kernel cuTile?", shared by the prefix guard, the benchmark's
classifier and the bot's recomputation of coverage.

A profiled kernel is cuTile only when its name is exactly a symbol the cuTile compiler gives a
``@ct.kernel`` function of the measured tree. The compiler names every compiled signature
``mangle_kernel_name(function.__name__, signature)``: ``<function>_K<conv>_<param>...``, the
same string in an exported cubin's symbol table and in a JIT launch's profile. Each condition:

- *cuTile's demangler reads it* (``demangle_kernel_name``): a function name, a calling
  convention it knows and a parameter list, nothing left over.
- *re-mangling gives back the very symbol*: the demangler is lenient where the compiler is
  canonical (``I03`` for ``I3``, unsorted or zero-padded axis masks, ``I_0``), so a name built to
  parse, or a real symbol with a suffix stuck on, must fail here, not pass as "parses".
- *at least one parameter*: ``fused_rmsnorm_Kt2`` (a bare function name plus a convention
  code) is the shortest look-alike any kernel can be given; a launch always has parameters.
- *the function is a Python identifier that imitates no generated kernel*: Inductor names a
  fused Triton kernel after the ops it fuses, custom ops included, plus ``_<index>``
  (``triton_poi_fused__to_copy_bmm_cat_cos_mul_qk_norm_rope_sin_slice_transpose_view_3``).
  A custom op ``zzrope_Kt2_A9f32_1t`` gives ``triton_poi_fused__to_copy_zzrope_Kt2_A9f32_1t_3``,
  which demangles *and* round-trips (``_3`` reads as a stride of -3), and for a custom op
  ``zz_Kt2_A1f32_1l0_I`` the compiler itself names a ``@ct.kernel`` decoy
  ``triton_poi_fused__to_copy_zz`` exactly like Inductor's kernel: only the name tells them
  apart. No function whose name starts like Inductor's or a vendor library's kernels
  (``GENERATED_PREFIXES``, any case) is a cuTile kernel; the code rules refuse such a
  ``@ct.kernel`` and a custom op name holding the mark (``MANGLING_MARK_PATTERN``).
- *the function is a ``@ct.kernel`` of the measured tree*, found by parsing (never by
  importing: a kernel module may need a GPU toolchain to import, and the tree may be untrusted).

A listed prefix adds the bare function name a profiler may report; it must itself be such a
function and matches only that exact name, never a longer identifier or a C++ signature (a
kernel called ``void`` must not claim every ``void at::native::...``).

Recognised decorators: ``@ct.kernel``, ``@cuda.tile.kernel``, either one called with options
(``@ct.kernel(num_ctas=2)``), and any alias the module binds with ``import cuda.tile as X`` or
``from cuda.tile import kernel as Y``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

TILE_MODULE = "cuda.tile"
# How kernels that are not cuTile's are named, as the H200 profiles in docs/results show them:
# Inductor's Triton (``triton_poi_fused_...``, ``triton_per_...``) and C++ (``cpp_fused_...``)
# kernels; cuBLAS/cuBLASLt (``nvjet_sm90_tst_...``, ``sm80_xmma_gemm_...``, ``void
# cublasLt::...``, the older ``ampere_bf16_...``), cuDNN (``cudnn_generated_...``), CUTLASS
# (``void cutlass::Kernel2<...>``), copies (``memcpy32_post``), any demangled C++ kernel
# (``void at::native::...``) and an Itanium-mangled one (``_ZN7cutlass...``, case-sensitive).
GENERATED_PREFIXES = (
    "triton_",
    "cpp_",
    "nvjet",
    "cublas",
    "cudnn",
    "cutlass",
    "xmma",
    "ampere_",
    "hopper_",
    "volta_",
    "turing_",
    "memcpy",
    "memset",
    "void",
)
_GENERATED = re.compile(
    "(?i:" + "|".join(map(re.escape, GENERATED_PREFIXES)) + r"|sm\d+_)|_Z[A-Z0-9]"
)
# cuTile's mark between a function name and its signature: ``_K`` and a calling convention code
# (``t1``, ``t2``), then a parameter or the end. cuTile escapes every other ``K`` of what it
# mangles, so a name holding this mark is shaped to be read as a cuTile symbol.
MANGLING_MARK_PATTERN = re.compile(r"(?:^|_)K[a-z][0-9]+(?=_|$)")
# Files larger than this are not parsed (a guard reports them instead of spending minutes).
MAX_PARSED_BYTES = 2 * 1024 * 1024


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _kernel_decorator_names(tree: ast.AST) -> set[str]:
    """Dotted decorator spellings that mean ``cuda.tile.kernel`` in this module."""
    names = {"ct.kernel", f"{TILE_MODULE}.kernel"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == TILE_MODULE and alias.asname:
                    names.add(f"{alias.asname}.kernel")
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                bound = alias.asname or alias.name
                if node.module == TILE_MODULE and alias.name == "kernel":
                    names.add(bound)
                elif node.module == "cuda" and alias.name == "tile":
                    names.add(f"{bound}.kernel")
    return names


def kernel_definitions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function of a parsed module decorated as a cuTile kernel."""
    decorators = _kernel_decorator_names(tree)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            if _dotted(target) in decorators:
                yield node
                break


def kernel_functions(source: str) -> Iterator[str]:
    """Yield the name of every function in ``source`` decorated as a cuTile kernel.

    Raises SyntaxError/ValueError for source that does not parse.
    """
    for node in kernel_definitions(ast.parse(source)):
        yield node.name


def names_in_sources(sources: Iterable[bytes]) -> frozenset[str]:
    """Kernel names defined in Python sources; an unparsable or oversized one defines none
    (ruff reports it; here it simply adds no kernel)."""
    names: set[str] = set()
    for data in sources:
        if len(data) > MAX_PARSED_BYTES:
            continue
        try:
            names.update(kernel_functions(data.decode("utf-8")))
        except (UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
            continue
    return frozenset(names)


def scan_kernel_names(root: Path) -> frozenset[str]:
    """Kernel names defined in the ``*.py`` files under ``root`` (a checkout's src/tilegym)."""

    def sources() -> Iterator[bytes]:
        for path in sorted(root.rglob("*.py")):
            try:
                if path.stat().st_size <= MAX_PARSED_BYTES:
                    yield path.read_bytes()
            except OSError:
                continue

    return names_in_sources(sources())


def imitated_generated_prefix(name: str) -> str | None:
    """The start of ``name`` that generated or vendor kernels' names share, or None."""
    match = _GENERATED.match(name)
    return match.group(0) if match else None


def mangling_mark(name: str) -> str | None:
    """cuTile's mangling mark inside ``name`` (``_Kt2``), or None."""
    match = MANGLING_MARK_PATTERN.search(name)
    return match.group(0) if match else None


def prefix_problem(prefix: str, kernel_names: Iterable[str]) -> str | None:
    """Why ``prefix`` may not widen the cuTile count, or None when it is a kernel's name."""
    if prefix not in set(kernel_names):
        return "names no @ct.kernel function"
    imitated = imitated_generated_prefix(prefix)
    if imitated is not None:
        return f"names a kernel that starts like generated or vendor kernels ({imitated!r})"
    return None


def _mangling():
    """cuTile's (demangle, mangle) pair, or None where cuda.tile is not installed."""
    try:
        from cuda.tile.compilation import demangle_kernel_name, mangle_kernel_name
    except ImportError:
        return None
    return demangle_kernel_name, mangle_kernel_name


class CutileNames:
    """The rule above for one measured tree: its kernel names and its listed prefixes."""

    def __init__(self, kernel_names: Iterable[str], prefixes: Iterable[str] = ()):
        self.kernel_names = frozenset(kernel_names)
        self.prefixes = frozenset(
            p for p in prefixes if prefix_problem(p, self.kernel_names) is None
        )
        self._mangling = _mangling()
        self._cache: dict[str, bool] = {}

    @property
    def can_demangle(self) -> bool:
        return self._mangling is not None

    def demangled_function(self, name: str) -> str | None:
        """The function ``name`` is the cuTile symbol of (whatever tree), or None: every
        condition of the module docstring but membership in the tree."""
        if self._mangling is None:
            return None
        demangle, mangle = self._mangling
        try:
            function, signature = demangle(name)
            canonical = mangle(function, signature)
        except Exception:  # both reject foreign names with several exception types
            return None
        if canonical != name or not signature.parameters or not function.isidentifier():
            return None
        return None if imitated_generated_prefix(function) else function

    def is_cutile(self, name: str) -> bool:
        hit = self._cache.get(name)
        if hit is None:
            hit = self.demangled_function(name) in self.kernel_names or name in self.prefixes
            self._cache[name] = hit
        return hit
