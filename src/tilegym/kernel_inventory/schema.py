"""JSON Schema validation of Definitions and Solutions, errors mapped to file lines."""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

import jsonschema

from tilegym.findings import Finding
from tilegym.kernel_inventory import codes
from tilegym.kernel_inventory.jsonfile import JsonFile, finding

KINDS = ("definition", "solution")


@functools.cache
def load_schema(kind: str) -> dict[str, Any]:
    """The packaged JSON Schema for ``kind`` ("definition" or "solution")."""
    if kind not in KINDS:
        raise ValueError(f"unknown inventory kind {kind!r}")
    text = resources.files(__package__).joinpath(f"schemas/{kind}.schema.json").read_text("utf-8")
    return json.loads(text)


@functools.cache
def _validator(kind: str) -> jsonschema.protocols.Validator:
    schema = load_schema(kind)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def schema_findings(doc: JsonFile, kind: str) -> list[Finding]:
    """One finding per schema error, at the line of the key it concerns."""
    errors = sorted(_validator(kind).iter_errors(doc.data), key=lambda e: list(e.absolute_path))
    found: list[Finding] = []
    for error in _leaf_errors(errors):
        found.append(_to_finding(doc, error))
    return found


def _leaf_errors(errors):
    """Replace ``if/then`` and ``oneOf`` wrappers by the specific errors beneath them."""
    for error in errors:
        if error.validator == "oneOf" and error.context:
            best = jsonschema.exceptions.best_match(error.context)
            yield best if best is not None else error
        else:
            yield error


def _to_finding(doc: JsonFile, error: jsonschema.ValidationError) -> Finding:
    path = tuple(error.absolute_path)
    where = ".".join(str(p) for p in path) or "(top level)"
    kind = error.validator
    if kind == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(error.schema.get("properties", {}))
        extra = sorted(k for k in error.instance if k not in allowed)
        if extra:
            key = extra[0]
            names = ", ".join(repr(k) for k in extra)
            return finding(
                doc.path,
                doc.line_of((*path, key)),
                codes.SCHEMA_UNKNOWN_KEY,
                f"{where}: unknown key(s) {names}; allowed: {', '.join(sorted(allowed))}",
            )
    if kind == "required":
        return finding(
            doc.path, doc.line_of(path), codes.SCHEMA_MISSING_KEY, f"{where}: {error.message}"
        )
    if kind == "type":
        return finding(
            doc.path, doc.line_of(path), codes.SCHEMA_WRONG_TYPE, f"{where}: {_short(error)}"
        )
    if path[:2] == ("spec", "target_hardware") and kind == "pattern":
        return finding(
            doc.path,
            doc.line_of(path),
            codes.HARDWARE_INVALID,
            f"{where}: target hardware must be SM<NN> (e.g. SM90, SM100), got {error.instance!r}",
        )
    if path == ("spec", "entry_point") and kind == "pattern":
        return finding(
            doc.path,
            doc.line_of(path),
            codes.ENTRY_POINT_FORMAT,
            f"{where}: entry_point must be 'repo/relative/file.py::function', "
            f"got {error.instance!r}",
        )
    if kind in {
        "enum",
        "const",
        "pattern",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "minItems",
        "minProperties",
        "uniqueItems",
        "propertyNames",
    }:
        return finding(
            doc.path, doc.line_of(path), codes.SCHEMA_BAD_VALUE, f"{where}: {_short(error)}"
        )
    return finding(doc.path, doc.line_of(path), codes.SCHEMA_OTHER, f"{where}: {_short(error)}")


def _short(error: jsonschema.ValidationError) -> str:
    message = error.message
    return message if len(message) <= 200 else message[:197] + "..."
