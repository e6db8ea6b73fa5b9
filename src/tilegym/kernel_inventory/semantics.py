"""Rules beyond the JSON Schema for one Definition or one Solution.

Each rule has its own finding code (``codes``). Definition rules are pure (the reference is
parsed with ``ast``, never executed); Solution rules read the cited source files from the
repository but never import them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path, PurePosixPath

from tilegym.findings import Finding
from tilegym.kernel_inventory import codes
from tilegym.kernel_inventory.jsonfile import JsonFile, finding
from tilegym.kernel_inventory.models import Definition, Solution, TensorSpec
from tilegym.kernel_inventory.permalink import (
    PermalinkError,
    iter_source_lines,
    leading_source_lines,
    parse_permalink,
)
from tilegym.kernel_inventory.tolerances import TOLERANCES, loosest_input_tolerance

_TAG = re.compile(r"^[a-z][a-z0-9_.-]*:\S.*$")
_MAX_SOURCE_BYTES = 2_000_000


def definition_findings(doc: JsonFile, definition: Definition, stem: str) -> list[Finding]:
    found: list[Finding] = []
    path = doc.path

    def add(json_path: tuple, code: str, message: str) -> None:
        found.append(finding(path, doc.line_of(json_path), code, message))

    if definition.name != stem:
        add(
            ("name",),
            codes.NAME_STEM,
            f"name {definition.name!r} must equal the file stem {stem!r}",
        )

    found.extend(reference_findings(doc, definition))

    for group in ("inputs", "outputs"):
        for tensor in getattr(definition, group).values():
            for axis in tensor.shape or ():
                if axis not in definition.axes:
                    add(
                        (group, tensor.name, "shape"),
                        codes.UNDECLARED_AXIS,
                        f"{group}.{tensor.name} uses axis {axis!r}, which 'axes' does not declare",
                    )

    for tensor in definition.inputs.values():
        problem = index_of_problem(definition, tensor)
        if problem:
            add(("inputs", tensor.name, "index_of"), codes.INDEX_OF_INVALID, problem)

    for tensor in definition.outputs.values():
        problem = tolerance_problem(definition, tensor)
        if problem:
            add(("outputs", tensor.name, "tolerance"), codes.TOLERANCE_INVALID, problem)

    for index, text in enumerate(definition.constraints):
        problem = constraint_problem(text, set(definition.axes))
        if problem:
            add(("constraints", index), codes.CONSTRAINT_INVALID, f"constraint {text!r}: {problem}")

    for name in sorted(set(definition.inputs) & set(definition.outputs)):
        add(("outputs", name), codes.INPUT_OUTPUT_CLASH, f"{name!r} is both an input and an output")

    for index, tag in enumerate(definition.tags):
        if not _TAG.match(tag):
            add(
                ("tags", index),
                codes.TAG_NOT_NAMESPACED,
                f"tag {tag!r} must be namespaced as 'namespace:value' (model:, stage:, ...)",
            )
    for index, target in enumerate(definition.tag_values("mutates")):
        if target not in definition.inputs:
            add(
                ("tags",),
                codes.MUTATES_UNKNOWN,
                f"tag 'mutates:{target}' names no input (tag #{index})",
            )
    return found


INTEGER_DTYPES = frozenset({"int8", "int16", "int32", "int64"})


def index_of_problem(definition: Definition, tensor: TensorSpec) -> str | None:
    """Why ``tensor.index_of`` is unusable, or None: parity draws the values in [0, size of the
    axis), so the axis must be the Definition's and the values integers."""
    axis = tensor.index_of
    if axis is None:
        return None
    problems = []
    if axis not in definition.axes:
        problems.append(f"names no axis (axes: {', '.join(definition.axes)})")
    if tensor.dtype not in INTEGER_DTYPES:
        problems.append(f"needs an integer dtype, not {tensor.dtype}")
    if not problems:
        return None
    return f"inputs.{tensor.name}.index_of {axis!r} " + " and ".join(problems)


def tolerance_problem(definition: Definition, tensor: TensorSpec) -> str | None:
    """Why an output's own ``tolerance`` is unusable, or None: it replaces a float dtype's bar and
    may not pass more error than the lowest-precision float input brings in."""
    if tensor.tolerance is None:
        return None
    if tensor.dtype not in TOLERANCES:
        return f"outputs.{tensor.name}.tolerance on a {tensor.dtype} output (exact or unsupported)"
    bound = loosest_input_tolerance({n: t.dtype for n, t in definition.inputs.items()})
    if bound is None or tensor.tolerance > bound:
        return (
            f"outputs.{tensor.name}.tolerance {tensor.tolerance:g} is looser than the inputs "
            f"allow ({'no float input' if bound is None else f'at most {bound:g}'})"
        )
    return None


def reference_findings(doc: JsonFile, definition: Definition) -> list[Finding]:
    """The reference parses, opens with ``# Source:`` permalinks and defines ``run``."""
    found: list[Finding] = []
    line = doc.line_of(("reference",))
    reference = definition.reference

    def add(code: str, message: str) -> None:
        found.append(finding(doc.path, line, code, message))

    if not leading_source_lines(reference):
        add(
            codes.REFERENCE_NO_SOURCE,
            "reference must start with one or more '# Source: <permalink>' lines",
        )
    for source in iter_source_lines(reference):
        parsed = parse_permalink(source.url)
        if isinstance(parsed, PermalinkError):
            add(codes.PERMALINK_INVALID, f"reference line {source.lineno}: {parsed.message}")

    try:
        module = ast.parse(reference, filename="<reference>")
    except SyntaxError as exc:
        add(codes.REFERENCE_SYNTAX, f"reference line {exc.lineno}: syntax error: {exc.msg}")
        return found
    except (ValueError, RecursionError, MemoryError) as exc:
        add(codes.REFERENCE_SYNTAX, f"reference does not parse: {exc}")
        return found

    runs = [
        node
        for node in module.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "run"
    ]
    if not runs:
        add(codes.REFERENCE_NO_RUN, "reference defines no top-level function 'run'")
        return found
    run = runs[-1]
    params = [arg.arg for arg in (*run.args.posonlyargs, *run.args.args)]
    expected = list(definition.inputs)
    if params != expected or run.args.vararg is not None:
        shown = ", ".join(params) + (", *" + run.args.vararg.arg if run.args.vararg else "")
        add(
            codes.RUN_SIGNATURE,
            f"run({shown}) must take exactly the inputs in order: run({', '.join(expected)})",
        )
    return found


def constraint_problem(text: str, axis_names: set[str]) -> str | None:
    """Why ``text`` is not a Python expression over axis names, or None when it is."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        return f"not a Python expression ({exc.msg})"
    except (ValueError, RecursionError, MemoryError) as exc:
        return f"not a Python expression ({exc})"
    unknown = sorted(
        {
            node.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Name) and node.id not in axis_names
        }
    )
    if unknown:
        return f"uses undeclared name(s) {', '.join(unknown)}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Call | ast.Attribute | ast.Lambda | ast.Subscript):
            return "only arithmetic and comparisons over axis names are allowed"
        if isinstance(node, ast.NamedExpr | ast.comprehension | ast.Await | ast.Yield):
            return "only arithmetic and comparisons over axis names are allowed"
    return None


def solution_findings(
    doc: JsonFile, solution: Solution, stem: str, repo_root: Path
) -> list[Finding]:
    found: list[Finding] = []
    path = doc.path

    def add(json_path: tuple, code: str, message: str) -> None:
        found.append(finding(path, doc.line_of(json_path), code, message))

    if solution.definition != stem:
        add(
            ("definition",),
            codes.SOLUTION_STEM,
            f"file stem {stem!r} must equal the Solution's definition {solution.definition!r}",
        )

    seen: set[str] = set()
    usable: dict[str, Path] = {}
    for index, source in enumerate(solution.sources):
        where = ("sources", index, "path")
        if source in seen:
            add(where, codes.SOURCE_DUPLICATE, f"source {source!r} is listed twice")
            continue
        seen.add(source)
        problem = repo_relative_problem(source)
        if problem:
            add(where, codes.SOURCE_PATH_INVALID, f"source {source!r}: {problem}")
            continue
        resolved = _inside(repo_root, source)
        if resolved is None:
            add(
                where,
                codes.SOURCE_PATH_INVALID,
                f"source {source!r} resolves outside the repository",
            )
            continue
        if not resolved.is_file():
            add(where, codes.SOURCE_MISSING, f"source {source!r} does not exist under {repo_root}")
            continue
        usable[source] = resolved

    entry_file, _, function = solution.spec.entry_point.partition("::")
    where = ("spec", "entry_point")
    if entry_file not in solution.sources:
        add(
            where,
            codes.ENTRY_NOT_IN_SOURCES,
            f"entry point file {entry_file!r} is not among the sources",
        )
    elif entry_file in usable:
        problem = top_level_function_problem(usable[entry_file], function)
        if problem:
            add(
                where,
                codes.ENTRY_FUNCTION_MISSING,
                f"entry point {solution.spec.entry_point!r}: {problem}",
            )
    return found


def repo_relative_problem(path: str) -> str | None:
    """Why ``path`` is not a normalized repo-relative POSIX path, or None."""
    if "\\" in path or "\x00" in path:
        return "must be a POSIX path"
    pure = PurePosixPath(path)
    if pure.is_absolute() or re.match(r"^[A-Za-z]:", path):
        return "must be relative to the repository root, not absolute"
    if any(part in ("..", ".") for part in path.split("/")) or "//" in path or path.endswith("/"):
        return "must be normalized (no '.', '..' or empty segments)"
    return None


def _inside(repo_root: Path, relative: str) -> Path | None:
    try:
        root = repo_root.resolve()
        resolved = (root / relative).resolve()
    except (OSError, RuntimeError, ValueError):
        return None
    return resolved if resolved.is_relative_to(root) else None


def top_level_function_problem(file: Path, function: str) -> str | None:
    """Why ``file`` does not define ``function`` at module level (parsed, not imported)."""
    found = top_level_function(file, function)
    return found if isinstance(found, str) else None


def top_level_function(file: Path, function: str) -> ast.FunctionDef | ast.AsyncFunctionDef | str:
    """The module-level ``def function`` of ``file`` (parsed, not imported), or why not."""
    try:
        if file.stat().st_size > _MAX_SOURCE_BYTES:
            return "entry file is too large to parse"
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except SyntaxError as exc:
        return f"entry file line {exc.lineno}: syntax error: {exc.msg}"
    except (OSError, ValueError, RecursionError, MemoryError) as exc:
        return f"entry file cannot be read or parsed: {exc}"
    found = None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == function:
            found = node  # the last definition is the one the module binds
    return found if found is not None else f"no top-level 'def {function}' in {file.name}"


def entry_signature_findings(
    doc: JsonFile, solution: Solution, definition: Definition, repo_root: Path
) -> list[Finding]:
    """The entry point takes the Definition's tensors positionally (inputs, then outputs with
    destination passing), in the Definition's order but under any names, so one shared entry
    point serves every family's Definition of the op; and ``entry_kwargs`` binds exactly its
    keyword-only parameters (every one without a default, none it lacks). Parsed, not imported;
    an entry point that is missing is reported by ``solution_findings`` instead."""
    entry_file = _inside(repo_root, solution.spec.entry_file)
    if entry_file is None or not entry_file.is_file():
        return []
    node = top_level_function(entry_file, solution.spec.entry_function)
    if isinstance(node, str):
        return []
    found: list[Finding] = []
    entry = solution.spec.entry_point

    def add(json_path: tuple, code: str, message: str) -> None:
        found.append(finding(doc.path, doc.line_of(json_path), code, message))

    args = node.args
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    required = len(positional) - len(args.defaults)
    tensors = list(definition.inputs)
    if solution.spec.destination_passing_style:
        tensors += list(definition.outputs)
    takes = required <= len(tensors) and (
        args.vararg is not None or len(tensors) <= len(positional)
    )
    if not takes:
        shown = ", ".join(positional) + (f", *{args.vararg.arg}" if args.vararg else "")
        add(
            ("spec", "entry_point"),
            codes.ENTRY_SIGNATURE,
            f"entry point {entry!r} takes ({shown}) positionally, which cannot be called with "
            f"{definition.name}'s {len(tensors)} tensor(s) ({', '.join(tensors)})",
        )
    keyword_only = {a.arg for a in args.kwonlyargs}
    needed = [
        a.arg
        for a, default in zip(args.kwonlyargs, args.kw_defaults, strict=True)
        if default is None
    ]
    given = solution.spec.entry_kwargs
    missing = [name for name in needed if name not in given]
    if missing:
        add(
            ("spec", "entry_point"),
            codes.ENTRY_KWARGS,
            f"entry point {entry!r} needs keyword argument(s) {', '.join(missing)}: give them "
            "in spec.entry_kwargs",
        )
    if args.kwarg is None:
        unknown = [name for name in given if name not in keyword_only]
        if unknown:
            add(
                ("spec", "entry_kwargs"),
                codes.ENTRY_KWARGS,
                f"spec.entry_kwargs {', '.join(unknown)}: not a keyword-only parameter of "
                f"{entry!r}",
            )
    return found
