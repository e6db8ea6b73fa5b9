"""Set one model's flags in a ``MODEL_PATCH_KWARGS`` table, in place, as an experiment would.

    python set_patch_flags.py TILEGYM_PATCH_PY MODEL_KEY FLAG=True|False|N...

The preset's model type picks the entry; the entry's line is rewritten, nothing else. A flag
takes True or False; a tuning parameter of the patch (``monkey_patch.TUNING``, e.g.
``rope_heads``) takes an integer and joins the entry if it is not there yet.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from tilegym_hf_bench.presets import PRESETS

from tilegym.transformers.monkey_patch import TUNING, check_tuning


def set_flags(source: str, model_type: str, changes: dict[str, bool | int]) -> str:
    """``source`` with the ``model_type`` entry's flags changed; error if absent or unknown."""
    pattern = re.compile(rf'^(\s*"{re.escape(model_type)}": )(\{{.*\}}),$', re.MULTILINE)
    match = pattern.search(source)
    if match is None:
        raise ValueError(f"no one-line MODEL_PATCH_KWARGS entry for {model_type!r}")
    flags = ast.literal_eval(match.group(2))
    unknown = sorted(set(changes) - set(flags) - set(TUNING))
    if unknown:
        known = ", ".join([*flags, *(t for t in TUNING if t not in flags)])
        raise ValueError(f"unknown flags {unknown} (known: {known})")
    check_tuning({k: v for k, v in changes.items() if k in TUNING})
    flags.update(changes)
    line = "{" + ", ".join(f'"{k}": {v}' for k, v in flags.items()) + "}"
    return source[: match.start(2)] + line + source[match.end(2) :]


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("error: usage: set_patch_flags.py FILE MODEL_KEY FLAG=VALUE...", file=sys.stderr)
        return 2
    path, key, *assignments = argv
    if key not in PRESETS:
        print(f"error: unknown model key {key!r}", file=sys.stderr)
        return 2
    changes = {}
    for item in assignments:
        flag, _, value = item.partition("=")
        if flag in TUNING and value.isdigit():
            changes[flag] = int(value)
        elif flag not in TUNING and value in ("True", "False"):
            changes[flag] = value == "True"
        else:
            want = f"{flag}=N (an integer)" if flag in TUNING else f"{flag}=True or {flag}=False"
            print(f"error: {item}: expected {want}", file=sys.stderr)
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
