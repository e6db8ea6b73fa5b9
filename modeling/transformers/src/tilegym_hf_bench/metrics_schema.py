"""The metrics file contract (``tilegym-bench-metrics/2``): load and validate with jsonschema.

The benchmark writes version 2; version-1 files (written before ``--mode``) stay valid and mean
eager mode: one schema file holds both, and version 1 may carry none of version 2's fields.
Torch-free on purpose: the bot validates metrics on machines that never run a model.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

import jsonschema

SCHEMA_ID = "tilegym-bench-metrics/2"
READABLE_SCHEMA_IDS = ("tilegym-bench-metrics/1", SCHEMA_ID)


@functools.cache
def load_schema() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("schemas/bench_metrics.schema.json").read_text()
    return json.loads(text)


def validation_errors(doc: Any) -> list[str]:
    """Every schema violation of ``doc`` as ``<json path>: <message>``, empty when valid."""
    validator = jsonschema.Draft202012Validator(
        load_schema(), format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    return [f"{e.json_path}: {e.message}" for e in errors]
