"""How close a Solution's output must come to its reference, per output dtype.

Shared by parity (which applies it) and the semantic checks (which bound a Definition's own
``tolerance`` on an output by the precision its inputs arrive in)."""

from __future__ import annotations

from collections.abc import Mapping

TOLERANCES: dict[str, float] = {
    "float32": 1e-4,
    "float16": 5e-3,
    "bfloat16": 2e-2,
    "float8_e4m3fn": 1e-1,
    "float8_e5m2": 2e-1,
}
"""Largest allowed relative error ``||out-ref||/||ref||`` per output dtype; integers are exact."""


def loosest_input_tolerance(input_dtypes: Mapping[str, str]) -> float | None:
    """The dtype tolerance of the lowest-precision float input, or None without float inputs.

    An output computed from bf16 inputs cannot be held to less error than bf16 carries in, so a
    Definition may relax an fp32 output's bar down to that, and no further."""
    found = [TOLERANCES[d] for d in input_dtypes.values() if d in TOLERANCES]
    return max(found) if found else None
