"""What the code an experiment may change may not do, read from its parsed source. Pure.

That code (``modeling_<K>.py``, ``kernels/*.py``, the body of ``apply_tilegym_kernel_to_<K>``)
runs inside the process that measures it. It may use the model, torch and ``tilegym``'s ops; it
may not reach the harness, the bot or the hooks (directly or through the import machinery, the
interpreter's module table, frames or the garbage collector), run code built from strings,
rebind attributes of modules it does not own, or launch kernels of another GPU language (every
kernel an experiment adds is cuTile, which is what coverage counts). Nor may it name things so
that other kernels read as cuTile's: a ``@ct.kernel`` named like Inductor's or a vendor
library's kernels (``triton_poi_fused_...``), or a string (a custom op's name) holding cuTile's
mangling mark (``zzrope_Kt2_A9f32_1t``), which Inductor copies into the names of the Triton
kernels it fuses around that op. The classifier refuses such kernels by itself
(``tilegym_hf_bench.profiling.cutile_names``); these findings name the attempt at its line.

This is a static check of the source: it cannot follow every dynamic path in Python. What it
rules out is every spelling the review found, and the judge does not rely on it alone (the
supervisor and the bot recompute the verdict's numbers outside the experiment's process).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass

from tilegym_hf_bench.profiling.cutile_names import (
    imitated_generated_prefix,
    kernel_definitions,
    mangling_mark,
)

TRUSTED_PACKAGES = frozenset({"tilegym_hf_bench", "tilegym_bot", "tilegym_hooks"})
# Modules that reach other modules' objects, frames or memory, or run source text.
REACHING_MODULES = frozenset(
    {"importlib", "builtins", "runpy", "gc", "ctypes", "sys", "traceback", "pkgutil"}
)
# Another GPU language or a way to compile and launch foreign GPU code.
FOREIGN_GPU_MODULES = frozenset(
    {
        "triton",
        "cupy",
        "numba",
        "pycuda",
        "warp",
        "tilelang",
        "cutlass",
        "jax",
        "taichi",
        "cuda.core",
        "cuda.bindings",
        "cuda.cuda",
        "cuda.nvrtc",
        "torch.utils.cpp_extension",
        "torch.cuda.jiterator",
        "torch._inductor",
    }
)
FORBIDDEN_CALLS = frozenset({"__import__", "exec", "eval", "compile", "globals", "vars"})
FORBIDDEN_NAMES = frozenset({"__builtins__", "__loader__", "__spec__"})
FORBIDDEN_ATTRIBUTES = frozenset(
    {
        "_getframe",
        "f_back",
        "f_globals",
        "f_locals",
        "f_builtins",
        "tb_frame",
        "gi_frame",
        "cr_frame",
        "ag_frame",
        "__globals__",
        "__builtins__",
        "__subclasses__",
        "__import__",
        "__loader__",
        "__spec__",
    }
)
# inspect's frame walkers (its signature helpers stay usable)
FRAME_WALKERS = frozenset(
    {"currentframe", "stack", "trace", "getouterframes", "getinnerframes", "getframeinfo"}
)
# ``torch.sys.modules`` and the like: a reaching module through another module's attribute.
FORBIDDEN_ATTRIBUTES |= REACHING_MODULES
MUTATING_BUILTINS = frozenset({"setattr", "delattr"})


@dataclass(frozen=True)
class CodeFinding:
    line: int
    code: str
    message: str


def _root(module: str) -> str:
    return module.split(".")[0]


def _module_problem(module: str) -> tuple[str, str] | None:
    """(code, message) when importing ``module`` is not allowed in experiment code."""
    if _root(module) in TRUSTED_PACKAGES:
        return (
            "SCOPE010",
            f"imports {module}: experiment code may not reach the harness, bot or hooks",
        )
    if _root(module) in REACHING_MODULES:
        return (
            "SCOPE011",
            f"imports {module}: experiment code may not use the import machinery, frames or "
            "interpreter internals",
        )
    for foreign in FOREIGN_GPU_MODULES:
        if module == foreign or module.startswith(foreign + "."):
            return (
                "SCOPE012",
                f"imports {module}: every kernel an experiment adds is cuTile "
                "(no other GPU language)",
            )
    return None


def _inspect_aliases(tree: ast.AST) -> set[str]:
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name == "inspect"
    }


def _imported_modules(node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    if node.level:  # relative: inside the experiment's own package
        return
    module = node.module or ""
    yield module
    for alias in node.names:  # ``from cuda import core`` imports cuda.core
        yield f"{module}.{alias.name}"


def _owned(module: str, owned_prefix: str) -> bool:
    return module == owned_prefix or module.startswith(owned_prefix + ".")


def _foreign_bindings(tree: ast.AST, owned_prefix: str) -> set[str]:
    """Names bound by imports of modules (or their members) that the experiment does not own."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _owned(alias.name, owned_prefix):
                    bound.add(alias.asname or alias.name.split(".")[0])
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and not _owned(node.module or "", owned_prefix)
        ):
            bound.update(alias.asname or alias.name for alias in node.names)
    return bound


def _base_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _kernel_name_findings(tree: ast.AST) -> Iterator[CodeFinding]:
    """A ``@ct.kernel`` named like a generated or vendor kernel (one finding each)."""
    for node in kernel_definitions(tree):
        imitated = imitated_generated_prefix(node.name)
        if imitated is not None:
            yield CodeFinding(
                node.lineno,
                "SCOPE015",
                f"@ct.kernel {node.name} starts like generated or vendor kernels ({imitated!r}); "
                "a cuTile kernel may not be named like another tool's kernels",
            )


_WORD = re.compile(r"[A-Za-z0-9_]+")


def _mangled_string_findings(tree: ast.AST) -> Iterator[CodeFinding]:
    """A string (custom op name, schema, anything but a docstring) holding a word with cuTile's
    mangling mark: one finding per string, for its first such word."""
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
            continue
        if id(node) in docstrings:
            continue
        for word in _WORD.findall(node.value):
            mark = mangling_mark(word)
            if mark is not None:
                yield CodeFinding(
                    node.lineno,
                    "SCOPE016",
                    f"name {word!r} holds cuTile's mangling mark {mark!r}: Inductor names the "
                    "kernels it fuses around a custom op after it, as if they were cuTile's",
                )
                break


def code_findings(tree: ast.AST, owned_prefix: str) -> list[CodeFinding]:
    """Findings for one parsed file (or function) of experiment code.

    ``owned_prefix``: the module path the experiment owns, e.g. ``tilegym.transformers.qwen3``.
    """
    findings: list[CodeFinding] = []
    foreign = _foreign_bindings(tree, owned_prefix)
    inspect_names = _inspect_aliases(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 1)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for module in _imported_modules(node):
                problem = _module_problem(module)
                if module in {f"inspect.{w}" for w in FRAME_WALKERS}:
                    problem = ("SCOPE013", f"imports {module}: no frame walking")
                if problem:
                    findings.append(CodeFinding(line, *problem))
                    break
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.func.id
            if name in FORBIDDEN_CALLS:
                findings.append(
                    CodeFinding(
                        line,
                        "SCOPE013",
                        f"calls {name}(): no code from strings or namespace access",
                    )
                )
            elif name in MUTATING_BUILTINS and node.args and _base_name(node.args[0]) in foreign:
                target = ast.unparse(node.args[0])
                findings.append(
                    CodeFinding(
                        line, "SCOPE014", f"{name}() on {target}, which the experiment does not own"
                    )
                )
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            findings.append(CodeFinding(line, "SCOPE013", f"uses {node.id}: interpreter internals"))
        elif isinstance(node, ast.Attribute) and (
            node.attr in FORBIDDEN_ATTRIBUTES
            or (node.attr in FRAME_WALKERS and _base_name(node) in inspect_names)
        ):
            findings.append(
                CodeFinding(line, "SCOPE013", f"uses .{node.attr}: interpreter internals")
            )
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if (
                    isinstance(target, (ast.Attribute, ast.Subscript))
                    and _base_name(target) in foreign
                ):
                    text = ast.unparse(target)
                    findings.append(
                        CodeFinding(
                            line, "SCOPE014", f"rebinds {text}, which the experiment does not own"
                        )
                    )
    findings.extend(_kernel_name_findings(tree))
    findings.extend(_mangled_string_findings(tree))
    findings.sort(key=lambda f: (f.line, f.code))
    return findings
