"""Experiment-scope rule: which changes an experiment branch for model K may make.

Pure: the input is a model key and the changed files with their base and head contents; the
output is findings, one per offending file. Which code changed is decided on the parsed code
(``ast.dump`` of top-level statements, the parsed YAML), so comments, blank lines and moved
line numbers never count as changes.
"""

from __future__ import annotations

import ast
import copy
import difflib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

from tilegym.findings import Finding
from tilegym_hooks.code_rules import code_findings
from tilegym_hooks.paths import (
    BENCH_SCRIPT,
    MAX_PARSED_BYTES,
    MONKEY_PATCH,
    PREFIXES_YAML,
    SHARED_ENTRY_DIR,
    TILEGYM_PATCH,
    TRANSFORMERS_DIR,
)
from tilegym_hooks.prefix_file import parse_prefixes

MODEL_KEY_RE = re.compile(r"[a-z0-9][a-z0-9_]*")
BRANCH_RE = re.compile(r"experiment/(?P<key>[^/]+)/(?P<slug>.+)")
PATCH_KWARGS_NAME = "MODEL_PATCH_KWARGS"


@dataclass(frozen=True)
class Change:
    """One changed path: its content at the base and at the head (None where absent).

    A rename or copy is given as two changes, the old path deleted and the new one added.
    """

    path: str
    base: bytes | None
    head: bytes | None


def patch_function_name(model_key: str) -> str:
    return f"apply_tilegym_kernel_to_{model_key}"


def model_key_from_branch(branch: str) -> str | None:
    """``experiment/<K>/<slug>`` → K; None for any other branch name.

    Raises ValueError for an ``experiment/...`` name whose key is not a model key.
    """
    if not branch.startswith("experiment/"):
        return None
    match = BRANCH_RE.fullmatch(branch)
    if match is None or not MODEL_KEY_RE.fullmatch(match["key"]):
        raise ValueError(
            f"branch {branch!r} is not experiment/<model_key>/<slug> "
            "(model_key: lower-case transformers submodule name)"
        )
    return match["key"]


def is_freely_allowed(model_key: str, path: str) -> bool:
    """True for the files an experiment for ``model_key`` may change in any way."""
    if path == BENCH_SCRIPT:
        return True
    parts = PurePosixPath(path).parts
    prefix = tuple(PurePosixPath(TRANSFORMERS_DIR, model_key).parts)
    if parts[: len(prefix)] != prefix or ".." in parts:
        return False
    rest = parts[len(prefix) :]
    if rest == (f"modeling_{model_key}.py",):
        return True
    if len(rest) != 2:
        return False
    folder, name = rest
    suffix = {"kernels": ".py", "kernel_definitions": ".json", "kernel_solutions": ".json"}
    wanted = suffix.get(folder)
    return wanted is not None and name.endswith(wanted) and len(name) > len(wanted)


def is_shared_glue(path: str) -> bool:
    """True for a module directly in ``src/tilegym/transformers/`` (the decoder forwards, the
    ``Family`` type, attention, cache and MoE glue): every family runs it, so an experiment for
    one model that changed it could change them all while measuring only its own."""
    return PurePosixPath(path).parent == PurePosixPath(TRANSFORMERS_DIR)


def is_shared_entry(path: str) -> bool:
    """True for a shared kernel entry point (``src/tilegym/ops/entry/``): other families'
    Solutions name it, so an experiment that changed it would change their kernels too. An
    experiment reuses one by naming it in its own Solution (its ``kernel_solutions/`` is its
    own) or writes its own variant in its ``kernels/`` folder."""
    return PurePosixPath(SHARED_ENTRY_DIR) in PurePosixPath(path).parents


def first_changed_line(base: bytes | None, head: bytes | None) -> int:
    """Line (on the head side) where the first changed hunk starts; 1 when there is none."""
    if not base or not head:
        return 1
    base_lines = base.splitlines()
    head_lines = head.splitlines()
    for number, (old, new) in enumerate(zip(base_lines, head_lines, strict=False), start=1):
        if old != new:
            return number
    return min(len(base_lines), len(head_lines)) + 1


class Unparsable(Exception):
    """A guarded file could not be parsed; carries the line for the finding."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line
        self.message = message


def _parse_python(data: bytes | None) -> ast.Module:
    if data is None:
        return ast.Module(body=[], type_ignores=[])
    if len(data) > MAX_PARSED_BYTES:
        raise Unparsable(1, f"file is larger than {MAX_PARSED_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unparsable(data.count(b"\n", 0, exc.start) + 1, "file is not UTF-8 text") from None
    try:
        return ast.parse(text)
    except SyntaxError as exc:
        raise Unparsable(exc.lineno or 1, f"Python syntax error: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise Unparsable(1, f"Python source does not parse: {exc}") from None


def _statement_label(statement: ast.stmt) -> str:
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        kind = "class" if isinstance(statement, ast.ClassDef) else "function"
        return f"{kind} {statement.name!r}"
    if isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        names = [ast.unparse(t) for t in targets]
        return f"assignment to {', '.join(names)}"
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return "import"
    return f"{type(statement).__name__.lower()} statement"


def _top_level_difference(
    base: ast.Module, head: ast.Module, keep: Callable[[ast.stmt], bool]
) -> tuple[int, list[str]] | None:
    """Compare the kept top-level statements; None when equal, else (head line, labels)."""
    base_body = [s for s in base.body if keep(s)]
    head_body = [s for s in head.body if keep(s)]
    matcher = difflib.SequenceMatcher(
        a=[ast.dump(s) for s in base_body], b=[ast.dump(s) for s in head_body], autojunk=False
    )
    edits = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    if not edits:
        return None
    changed = [s for _, i1, i2, j1, j2 in edits for s in head_body[j1:j2] + base_body[i1:i2]]
    labels = list(dict.fromkeys(_statement_label(s) for s in changed))
    _, _, _, j1, _ = edits[0]
    line = head_body[j1].lineno if j1 < len(head_body) else 1
    return line, labels


def _describe(labels: list[str]) -> str:
    shown = ", ".join(labels[:3])
    return shown + (f" and {len(labels) - 3} more" if len(labels) > 3 else "")


def monkey_patch_finding(model_key: str, change: Change) -> Finding | None:
    """Only the top-level function ``apply_tilegym_kernel_to_<K>`` may change (or appear)."""
    allowed = patch_function_name(model_key)
    if change.head is None:
        message = f"deleted; an experiment may only change {allowed}()"
        return Finding(change.path, 1, "SCOPE002", message)
    base, head = _parse_python(change.base), _parse_python(change.head)

    def keep(statement: ast.stmt) -> bool:
        is_function = isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef))
        return not (is_function and statement.name == allowed)

    difference = _top_level_difference(base, head, keep)
    if difference is None:
        return None
    line, labels = difference
    message = f"changes outside {allowed}(): {_describe(labels)}"
    return Finding(change.path, line, "SCOPE002", message)


def monkey_patch_code_findings(model_key: str, change: Change) -> list[Finding]:
    """The code rules on the head's ``apply_tilegym_kernel_to_<K>`` (when it changed)."""
    if change.head is None:
        return []
    allowed = patch_function_name(model_key)

    def function(module: ast.Module) -> ast.stmt | None:
        found = [
            s
            for s in module.body
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == allowed
        ]
        return found[-1] if found else None

    head = function(_parse_python(change.head))
    base = function(_parse_python(change.base))
    if head is None or (base is not None and ast.dump(base) == ast.dump(head)):
        return []
    wrapped = ast.Module(body=[head], type_ignores=[])
    return _as_findings(change.path, code_findings(wrapped, owned_module(model_key)))


def owned_module(model_key: str) -> str:
    """The module path an experiment for ``model_key`` owns."""
    return ".".join(PurePosixPath(TRANSFORMERS_DIR, model_key).parts[1:])


def _as_findings(path: str, found) -> list[Finding]:
    return [Finding(path, f.line, f.code, f.message) for f in found]


def experiment_code_findings(model_key: str, change: Change) -> list[Finding]:
    """The code rules on a freely changeable Python file of the experiment (whole file)."""
    if change.head is None or not change.path.endswith(".py"):
        return []
    return _as_findings(
        change.path, code_findings(_parse_python(change.head), owned_module(model_key))
    )


def _is_patch_kwargs(statement: ast.stmt) -> bool:
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, ast.AnnAssign):
        targets = [statement.target]
    else:
        return False
    named = any(isinstance(t, ast.Name) and t.id == PATCH_KWARGS_NAME for t in targets)
    return named and isinstance(statement.value, ast.Dict)


def _without_model_entry(module: ast.Module, model_key: str) -> ast.Module:
    """The module with the ``"K": ...`` pair dropped from the ``MODEL_PATCH_KWARGS`` dict."""
    body = []
    for statement in module.body:
        if _is_patch_kwargs(statement):
            table = statement.value
            pairs = [
                (k, v)
                for k, v in zip(table.keys, table.values, strict=True)
                if not (isinstance(k, ast.Constant) and k.value == model_key)
            ]
            statement = copy.copy(statement)
            statement.value = ast.Dict(keys=[k for k, _ in pairs], values=[v for _, v in pairs])
        body.append(statement)
    return ast.Module(body=body, type_ignores=[])


def _first_changed_entry_line(base: ast.Module, head: ast.Module) -> int | None:
    """Line of the first ``MODEL_PATCH_KWARGS`` entry at the head that the base lacks."""
    tables = [next((s.value for s in m.body if _is_patch_kwargs(s)), None) for m in (base, head)]
    if tables[0] is None or tables[1] is None:
        return None

    def entries(table: ast.Dict) -> list[tuple[int, str]]:
        pairs = zip(table.keys, table.values, strict=True)
        return [((k or v).lineno, f"{k and ast.dump(k)}: {ast.dump(v)}") for k, v in pairs]

    base_entries = {dump for _, dump in entries(tables[0])}
    return next((line for line, dump in entries(tables[1]) if dump not in base_entries), None)


def _non_literal_entry(module: ast.Module, model_key: str) -> int | None:
    """Line of the ``"K"`` entry when its value is not a literal (the harness reads it as data,
    so an expression there would either be ignored or, if evaluated, run experiment code)."""
    for statement in module.body:
        if not _is_patch_kwargs(statement):
            continue
        for key, value in zip(statement.value.keys, statement.value.values, strict=True):
            if isinstance(key, ast.Constant) and key.value == model_key:
                try:
                    ast.literal_eval(value)
                except (ValueError, TypeError, SyntaxError, RecursionError):
                    return value.lineno
    return None


def patch_entry(model_key: str) -> str:
    """The ``MODEL_PATCH_KWARGS`` key of experiments on ``model_key``: the model type its preset
    benchmarks (the bench selects flags by model type; ``gemma3`` patches ``gemma3_text``), or
    the key itself."""
    from tilegym_hf_bench.presets import PRESETS

    preset = PRESETS.get(model_key)
    return preset.model_type if preset is not None else model_key


def patch_kwargs_finding(model_key: str, change: Change) -> Finding | None:
    """Only the value under the experiment's key (``patch_entry``) of the module-level
    ``MODEL_PATCH_KWARGS`` may change, and only to a literal."""
    model_key = patch_entry(model_key)
    where = f'{PATCH_KWARGS_NAME}["{model_key}"]'
    if change.head is None:
        message = f"deleted; an experiment may only change {where}"
        return Finding(change.path, 1, "SCOPE003", message)
    parsed_head = _parse_python(change.head)
    line = _non_literal_entry(parsed_head, model_key)
    if line is not None:
        message = f"{where} must be a literal (flags as data: no names, calls or expressions)"
        return Finding(change.path, line, "SCOPE003", message)
    base = _without_model_entry(_parse_python(change.base), model_key)
    head = _without_model_entry(parsed_head, model_key)
    difference = _top_level_difference(base, head, lambda statement: True)
    if difference is None:
        return None
    line, labels = difference
    if labels == [f"assignment to {PATCH_KWARGS_NAME}"]:
        line = _first_changed_entry_line(base, head) or line
        message = f"changes {PATCH_KWARGS_NAME} entries other than {model_key!r}"
    else:
        message = f"changes outside {where}: {_describe(labels)}"
    return Finding(change.path, line, "SCOPE003", message)


def prefixes_finding(change: Change) -> Finding | None:
    """The prefix list may only grow: every base prefix must still be present at the head."""
    if change.head is None:
        return Finding(change.path, 1, "SCOPE004", "deleted; an experiment may only add prefixes")
    head = parse_prefixes(change.head, change.path)
    if head.findings:
        first = head.findings[0]
        raise Unparsable(first.line, first.message)
    if change.base is None:
        return None
    base = parse_prefixes(change.base, change.path)
    kept = {p.value for p in head.prefixes}
    removed = [p.value for p in base.prefixes if p.value not in kept]
    if not removed:
        return None
    line = first_changed_line(change.base, change.head)
    names = _describe([repr(name) for name in removed])
    message = f"removes prefix {names}; an experiment may only add prefixes"
    return Finding(change.path, line, "SCOPE004", message)


CONTENT_RULES: dict[str, Callable[[str, Change], Finding | None]] = {
    MONKEY_PATCH: monkey_patch_finding,
    TILEGYM_PATCH: patch_kwargs_finding,
    PREFIXES_YAML: lambda model_key, change: prefixes_finding(change),
}


def change_findings(model_key: str, change: Change) -> list[Finding]:
    """The findings for one changed path; empty when the experiment may make that change."""
    try:
        if is_freely_allowed(model_key, change.path):
            return experiment_code_findings(model_key, change)
        rule = CONTENT_RULES.get(change.path)
        if rule is None:
            line = first_changed_line(change.base, change.head)
            message = f"outside the scope of a {model_key!r} experiment"
            if is_shared_glue(change.path):
                message = f"shared by every family, {message} (wire a kernel in through "
                message += f"Family.forwards in modeling_{model_key}.py)"
            elif is_shared_entry(change.path):
                message = f"a kernel entry point shared by every family, {message} (name it in "
                message += f"{model_key}'s Solution, or write {model_key}'s own variant in "
                message += f"{TRANSFORMERS_DIR}/{model_key}/kernels/)"
            return [Finding(change.path, line, "SCOPE001", message)]
        finding = rule(model_key, change)
        if finding is not None:
            return [finding]
        if change.path == MONKEY_PATCH:
            return monkey_patch_code_findings(model_key, change)
        return []
    except Unparsable as exc:
        return [Finding(change.path, exc.line, "SCOPE005", f"cannot check scope: {exc.message}")]


def scope_findings(model_key: str, changes: Iterable[Change]) -> list[Finding]:
    """The findings of every changed path (a path that appears in several changes counts once)."""
    seen: set[str] = set()
    found: list[Finding] = []
    for change in changes:
        if change.path in seen:
            continue
        seen.add(change.path)
        found.extend(change_findings(model_key, change))
    return sorted(found)
