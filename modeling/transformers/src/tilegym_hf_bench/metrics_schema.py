"""The metrics file contract (``tilegym-bench-metrics/1``): load and validate with jsonschema.

Torch-free on purpose: the bot validates metrics on machines that never run a model.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

import jsonschema

SCHEMA_ID = "tilegym-bench-metrics/1"


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
