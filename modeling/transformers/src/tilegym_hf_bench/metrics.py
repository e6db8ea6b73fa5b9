"""The metrics document (``tilegym-bench-metrics/2``): assembled from parts, written atomically.

Pure except ``write_atomic``. A run that did not complete (crash, timeout) carries no measured
block at all, so no consumer can read a number from it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from tilegym_hf_bench.metrics_schema import SCHEMA_ID
from tilegym_hf_bench.stats import summarize

MEASURED_PARTS = ("baseline", "cutile", "coverage", "correctness")


def throughput_block(
    tokens_per_s: list[float],
    ttft_ms: list[float],
    decode_tokens_per_s: list[float],
    interleaved: bool,
    compile_s: float | None = None,
) -> dict[str, Any]:
    """One side's ``throughput`` / ``ttft_ms`` / ``decode_tokens_per_s`` from raw samples, and
    the warm-up's one-time cost ``compile_s`` (seconds, None when not measured), kept apart
    from the timed samples it must never be part of."""
    s = summarize(tokens_per_s)
    return {
        "throughput": {
            "samples": list(tokens_per_s),
            "mean": s.mean,
            "std": s.std,
            "ci95": list(s.ci95) if s.ci95 is not None else None,
            "interleaved": interleaved,
        },
        "ttft_ms": {"samples": list(ttft_ms), "mean": summarize(ttft_ms).mean},
        "decode_tokens_per_s": {
            "samples": list(decode_tokens_per_s),
            "mean": summarize(decode_tokens_per_s).mean,
        },
        "compile_s": None if compile_s is None else round(max(compile_s, 0.0), 3),
    }


def assemble(
    *,
    status: str,
    error: str | None,
    model_key: str,
    model_id: str | None,
    weights: str,
    commit: str,
    started_at: str,
    wall_s: float,
    env: dict[str, Any],
    workload: dict[str, Any],
    parts: dict[str, Any],
    phases_s: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The whole document; ``parts`` holds the measured blocks (missing ones are null)."""
    complete = status == "ok"
    return {
        "schema": SCHEMA_ID,
        "status": status,
        "error": error,
        "model_key": model_key,
        "model_id": model_id,
        "weights": weights,
        "commit": commit,
        "started_at": started_at,
        "wall_s": round(max(wall_s, 0.0), 3),
        "phases_s": {k: round(max(float(v), 0.0), 3) for k, v in (phases_s or {}).items()},
        "env": env,
        "workload": workload,
        **{name: (parts.get(name) if complete else None) for name in MEASURED_PARTS},
    }


def write_atomic(path: str | os.PathLike, data: Any) -> None:
    """Metrics are strict JSON: a NaN fails here, before the file is touched. Written to a temp
    file beside the target, then renamed over it. (The harness keeps its own writer rather than
    ``tilegym.atomic``: the trusted processes import nothing from the measured tree.)"""
    text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", dir=target.parent, prefix=f".{target.name}.", delete=False, encoding="utf-8"
    ) as tmp:
        tmp.write(text)
    try:
        os.replace(tmp.name, target)
    except OSError:
        Path(tmp.name).unlink(missing_ok=True)
        raise
