"""The cuTile side of the benchmark: which patch flags each model gets, and applying them.

``MODEL_PATCH_KWARGS`` stays a plain dict of literals: the experiment-scope hook lets an
experiment change only its own model key's value, and the trusted harness reads the measured
tree's copy of this table as data (``experiment_tree``), never by importing it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MODEL_PATCH_KWARGS = {
    "qwen3": {
        "rope": True,
        "rms_norm": True,
        "swiglu": True,
        "attn": True,
        "linear": True,
        "rope_heads": 1,
        "norm_gemv": 1,
        "rope_gemv": 2,
    },
    "llama": {
        "rope": True,
        "rms_norm": True,
        "swiglu": True,
        "attn": True,
        "linear": True,
        "norm_gemv": 1,
        "rope_gemv": 1,
    },
    "mistral": {"rope": True, "rms_norm": True, "swiglu": True, "attn": True, "linear": True},
    "qwen2": {"rope": True, "rms_norm": True, "swiglu": True, "attn": True, "linear": True},
    "phi3": {"rope": True, "rms_norm": True, "swiglu": True, "attn": True, "linear": True},
    "olmo2": {"rope": True, "rms_norm": True, "swiglu": True, "attn": True, "linear": True},
    "gemma3_text": {"rope": True, "rms_norm": True, "swiglu": True, "attn": True, "linear": True},
    "qwen3_moe": {"rope": True, "rms_norm": True, "swiglu": True, "attn": True, "linear": True},
    "granite": {"rope": True, "rms_norm": True, "swiglu": True, "attn": True, "linear": True},
    "smollm3": {"rope": True, "rms_norm": True, "swiglu": True, "attn": True, "linear": True},
    "olmo3": {"rope": True, "rms_norm": True, "swiglu": True, "attn": True, "linear": True},
    "olmoe": {"rope": True, "rms_norm": True, "swiglu": True, "attn": True, "linear": True},
    "mixtral": {"rope": True, "rms_norm": True, "swiglu": True, "attn": True, "linear": True},
    "gpt_oss": {"rope": True, "rms_norm": True, "swiglu": True, "attn": True, "linear": True},
    "qwen3_5_text": {"rope": True, "rms_norm": True, "swiglu": True, "attn": True, "linear": True},
    "qwen3_next": {"rope": True, "rms_norm": True, "swiglu": True, "attn": True, "linear": True},
    "deepseek_v2": {"rope": True, "rms_norm": True, "swiglu": True, "attn": True, "linear": True},
    "deepseek_v3": {"rope": True, "rms_norm": True, "swiglu": True, "attn": True, "linear": True},
}


class PatchUnavailable(Exception):
    """The cuTile patch cannot be applied at all (missing module, unsupported model type)."""


@dataclass
class PatchReport:
    """What the patch did to one model instance."""

    handle: Any
    flags: dict[str, Any]
    applied: list[str] = field(default_factory=list)
    not_applied: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        applied = ", ".join(self.applied) if self.applied else "none"
        out = [f"cuTile patch flags: {self.flags}", f"cuTile patch applied: {applied}"]
        for flag, reason in sorted(self.not_applied.items()):
            out.append(f"cuTile patch not applied: {flag} ({reason})")
        return out


def patch_flags(model_type: str, table: dict[str, Any] | None = None) -> dict[str, Any]:
    """The flags of ``model_type`` in ``table`` (the measured tree's; this file's when None)."""
    table = MODEL_PATCH_KWARGS if table is None else table
    try:
        return dict(table[model_type])
    except KeyError:
        raise PatchUnavailable(
            f"no cuTile patch flags for model type {model_type!r} "
            f"(MODEL_PATCH_KWARGS has {', '.join(table)})"
        ) from None


def apply_patch(model, model_type: str, table: dict[str, Any] | None = None) -> PatchReport:
    """Patch this model instance only, through ``tilegym.transformers.monkey_patch``."""
    flags = patch_flags(model_type, table)
    try:
        from tilegym.transformers.monkey_patch import apply_tilegym_kernel
    except ImportError as exc:
        raise PatchUnavailable(
            f"tilegym.transformers.monkey_patch is not importable: {exc}"
        ) from exc
    handle = apply_tilegym_kernel(model, **flags)
    return PatchReport(
        handle=handle,
        flags=flags,
        applied=list(getattr(handle, "applied", [])),
        not_applied=dict(getattr(handle, "not_applied", {})),
    )
