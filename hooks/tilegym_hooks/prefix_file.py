"""Parse ``tilegym_kernel_prefixes.yaml`` (``prefixes: [str, ...]``) into prefixes with lines.

Pure: takes the file's bytes, returns the prefixes and the findings. Shared by the prefix guard
and the scope guard (which compares the prefixes of base and head).
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from tilegym.findings import Finding
from tilegym_hooks.paths import MAX_PARSED_BYTES

KEY = "prefixes"


class UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that rejects a mapping with the same key twice (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if first != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r} (first on line {first})",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


@dataclass(frozen=True)
class Prefix:
    value: str
    line: int


@dataclass(frozen=True)
class ParsedPrefixes:
    prefixes: tuple[Prefix, ...]
    findings: tuple[Finding, ...]


def _yaml_error_line(exc: yaml.YAMLError) -> int:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return mark.line + 1 if mark is not None else 1


def _yaml_error_text(exc: yaml.YAMLError) -> str:
    parts = [getattr(exc, "context", None), getattr(exc, "problem", None)]
    text = "; ".join(p for p in parts if p)
    return text or str(exc).splitlines()[0]


def load_document(data: bytes, path: str) -> tuple[object, yaml.Node | None, list[Finding]]:
    """Load one YAML document with unique keys; on failure return one PREFIX000 finding."""

    def bad(line: int, message: str):
        return None, None, [Finding(path, line, "PREFIX000", message)]

    if len(data) > MAX_PARSED_BYTES:
        return bad(1, f"file is larger than {MAX_PARSED_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return bad(data.count(b"\n", 0, exc.start) + 1, "file is not UTF-8 text")
    try:
        loader = UniqueKeyLoader(text)
    except yaml.reader.ReaderError as exc:  # raised while the reader checks the characters
        line = text.count("\n", 0, exc.position) + 1
        return bad(line, f"invalid YAML: character {exc.character:#06x} is not allowed")
    try:
        node = loader.get_single_node()
        document = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        return bad(_yaml_error_line(exc), f"invalid YAML: {_yaml_error_text(exc)}")
    except RecursionError:
        return bad(1, "YAML nesting is too deep")
    finally:
        loader.dispose()
    return document, node, []


def parse_prefixes(data: bytes, path: str) -> ParsedPrefixes:
    """Prefixes in file order with their lines, and a finding for each malformed entry."""
    document, node, findings = load_document(data, path)
    if findings:
        return ParsedPrefixes((), tuple(findings))
    if not isinstance(document, dict) or set(document) != {KEY}:
        line = node.start_mark.line + 1 if node is not None else 1
        message = f"must be a mapping with the single key {KEY!r}"
        return ParsedPrefixes((), (Finding(path, line, "PREFIX001", message),))
    value_node = next((v for k, v in node.value if k.value == KEY), node)
    items = document[KEY]
    if items is None:
        items = []
    if not isinstance(items, list):
        line = value_node.start_mark.line + 1
        message = f"{KEY!r} must be a list of strings"
        return ParsedPrefixes((), (Finding(path, line, "PREFIX001", message),))
    prefixes: list[Prefix] = []
    out: list[Finding] = []
    first_line: dict[str, int] = {}
    item_nodes = value_node.value if isinstance(value_node, yaml.SequenceNode) else []
    for index, item in enumerate(items):
        line = (item_nodes[index] if index < len(item_nodes) else value_node).start_mark.line + 1
        if not isinstance(item, str):
            kind = type(item).__name__ if item is not None else "null"
            out.append(Finding(path, line, "PREFIX002", f"entry is a {kind}, not a string"))
        elif not item.strip():
            out.append(Finding(path, line, "PREFIX003", "entry is an empty string"))
        elif item in first_line:
            message = f"duplicate prefix {item!r} (first on line {first_line[item]})"
            out.append(Finding(path, line, "PREFIX004", message))
        else:
            first_line[item] = line
            prefixes.append(Prefix(item, line))
    return ParsedPrefixes(tuple(prefixes), tuple(out))
