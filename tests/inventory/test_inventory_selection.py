"""The compile gate's selection reads each repository file once per run, however many changed
files the pre-commit hook passes (it passes ~100; a scan per file made one run take minutes).
File reads are counted with a real audit hook on ``open``, not a patched function."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from inventory_helpers import DEFINITION, SOLUTION, make_tree, model_dir

from tilegym.kernel_inventory.imports import ImportGraph
from tilegym.kernel_inventory.jsonfile import parse_json_text
from tilegym.kernel_inventory.selection import select_solutions

_OPENED: Counter | None = None


def _count_opens(event: str, args: tuple) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], str | Path):
        _OPENED[str(args[0])] += 1


sys.addaudithook(_count_opens)  # audit hooks cannot be removed; it counts only when asked


def _tree_with_shared_ops(root: Path, kernels: int, helpers: int) -> list[Path]:
    """``kernels`` Solutions whose kernels import a chain of ``helpers`` ops modules."""
    make_tree(root)
    ops = root / "src" / "tilegym" / "ops"
    ops.mkdir(parents=True)
    (ops / "__init__.py").write_text("")
    for i in range(helpers):
        following = f"from tilegym.ops import helper_{i + 1}\n" if i + 1 < helpers else ""
        (ops / f"helper_{i}.py").write_text(following + f"X{i} = {i}\n")
    base = model_dir(root)
    changed = []
    for k in range(kernels):
        kernel = base / "kernels" / f"k{k}.py"
        kernel.write_text("from tilegym.ops import helper_0\n\n\ndef run(gate, up):\n    pass\n")
        definition = dict(DEFINITION, name=f"k{k}")
        solution = json.loads(json.dumps(SOLUTION))
        solution.update(name=f"k{k}", definition=f"k{k}")
        solution["spec"]["entry_point"] = f"{kernel.relative_to(root).as_posix()}::run"
        solution["sources"] = [{"path": kernel.relative_to(root).as_posix()}]
        (base / "kernel_definitions" / f"k{k}.json").write_text(json.dumps(definition))
        (base / "kernel_solutions" / f"k{k}.json").write_text(json.dumps(solution))
        changed.append(kernel)
    return changed


def _reads(paths: list[Path], root: Path) -> tuple[list[Path], Counter]:
    global _OPENED
    _OPENED = Counter()
    try:
        selected = select_solutions(paths, root)
    finally:
        opened, _OPENED = _OPENED, None
    return selected, Counter({path: n for path, n in opened.items() if path.startswith(str(root))})


def test_many_changed_files_read_each_repository_file_as_often_as_one_does(tmp_path):
    root = tmp_path / "repo"
    changed = _tree_with_shared_ops(root, kernels=6, helpers=5)
    ops = sorted((root / "src/tilegym/ops").glob("helper_*.py"))
    one, reads_for_one = _reads(changed[:1], root)
    every, reads_for_every = _reads([*changed, *ops], root)
    assert len(one) == 1 and len(every) == 6  # every kernel reaches every helper
    assert any(path.endswith("helper_4.py") for path in reads_for_one)
    assert reads_for_every == reads_for_one
    assert max(reads_for_every.values()) <= 2  # the loader and the import scan


def test_the_import_graph_answers_each_file_from_one_parse(tmp_path):
    root = tmp_path / "repo"
    _tree_with_shared_ops(root, kernels=1, helpers=4)
    graph = ImportGraph(root / "src")
    head = root / "src/tilegym/ops/helper_0.py"
    names = {p.name for p in graph.dependencies(head)}
    assert names == {"__init__.py", "helper_1.py", "helper_2.py", "helper_3.py"}
    (root / "src/tilegym/ops/helper_3.py").unlink()  # a second question is answered from memory
    assert {p.name for p in graph.dependencies(head)} == names


def test_a_truncated_json_names_line_and_column():
    raw = b'{\n  "name": "x",\n  "inputs": {"a": '
    found = parse_json_text(raw, "k.json")
    assert (found.path, found.line, found.code) == ("k.json", 3, "INV004")
    assert found.message == (
        "malformed JSON at column 19: Expecting value (the file ends there: truncated?)"
    )
    inner = parse_json_text(b'{"a": 1,, "b": 2}\n', "k.json")
    assert inner.message == (
        "malformed JSON at column 9: Expecting property name enclosed in double quotes"
    )
