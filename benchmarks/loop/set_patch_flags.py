"""Set one model's flags in a ``MODEL_PATCH_KWARGS`` table, in place, as an experiment would.

    python set_patch_flags.py TILEGYM_PATCH_PY MODEL_KEY FLAG=True|False|N...

The preset's model type picks the entry; the entry's value is rewritten, nothing else: on one
line where it fits ``LINE_LENGTH`` (the project's ruff limit), else one flag a line as ruff
formats it. A flag takes True or False; a tuning parameter of the patch
(``monkey_patch.TUNING``, e.g. ``rope_heads``) takes an integer and joins the entry if it is not
there yet.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from tilegym_hf_bench.presets import PRESETS

from tilegym.transformers.monkey_patch import TUNING, check_tuning, parse_setting

LINE_LENGTH = 100


def _entry(source: str, model_type: str) -> ast.Dict:
    """The dict value of ``MODEL_PATCH_KWARGS[model_type]`` in ``source``."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(f"line {exc.lineno}: not Python: {exc.msg}") from None
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if not (isinstance(target, ast.Name) and target.id == "MODEL_PATCH_KWARGS"):
            continue
        if isinstance(node.value, ast.Dict):
            for key, value in zip(node.value.keys, node.value.values, strict=True):
                named = isinstance(key, ast.Constant) and key.value == model_type
                if named and isinstance(value, ast.Dict):
                    return value
    raise ValueError(f"no MODEL_PATCH_KWARGS entry for {model_type!r}")


def _offset(source: str, line: int, col: int) -> int:
    """The character offset of (1-based line, 0-based UTF-8 column) in ``source``."""
    lines = source.splitlines(keepends=True)
    head = "".join(lines[: line - 1])
    return len(head) + len(lines[line - 1].encode()[:col].decode())


def _formatted(flags: dict, indent: int, key: str) -> str:
    """The entry's dict on one line if its line fits, else one flag a line (ruff's layout)."""
    items = [f'"{k}": {v}' for k, v in flags.items()]
    one = "{" + ", ".join(items) + "}"
    if indent + len(f'"{key}": ') + len(one) + 1 <= LINE_LENGTH:
        return one
    inner = " " * (indent + 4)
    return "{\n" + "".join(f"{inner}{item},\n" for item in items) + " " * indent + "}"


def set_flags(source: str, model_type: str, changes: dict[str, bool | int]) -> str:
    """``source`` with the ``model_type`` entry's flags changed; error if absent or unknown."""
    node = _entry(source, model_type)
    flags = ast.literal_eval(node)
    unknown = sorted(set(changes) - set(flags) - set(TUNING))
    if unknown:
        known = ", ".join([*flags, *(t for t in TUNING if t not in flags)])
        raise ValueError(f"unknown flags {unknown} (known: {known})")
    check_tuning({k: v for k, v in changes.items() if k in TUNING})
    flags.update(changes)
    start = _offset(source, node.lineno, node.col_offset)
    end = _offset(source, node.end_lineno, node.end_col_offset)
    line_start = source.rfind("\n", 0, start) + 1
    indent = len(source[line_start:start]) - len(source[line_start:start].lstrip())
    return source[:start] + _formatted(flags, indent, model_type) + source[end:]


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("error: usage: set_patch_flags.py FILE MODEL_KEY FLAG=VALUE...", file=sys.stderr)
        return 2
    path, key, *assignments = argv
    if key not in PRESETS:
        print(f"error: unknown model key {key!r}", file=sys.stderr)
        return 2
    try:
        changes = dict(parse_setting(item) for item in assignments)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    file = Path(path)
    try:
        text = set_flags(file.read_text(), PRESETS[key].model_type, changes)
    except ValueError as exc:
        print(f"{path}: error: {exc}", file=sys.stderr)
        return 1
    tmp = file.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
