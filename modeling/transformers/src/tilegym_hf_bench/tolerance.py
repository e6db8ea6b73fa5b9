"""The correctness rule, torch-free: the benchmark applies it, and the bot applies it again to
the errors a metrics file records (a file's own ``passed`` is never taken on trust)."""

from __future__ import annotations

import math
from dataclasses import dataclass

REL_ERR_FACTOR = 1.5
REL_ERR_FLOOR = 1e-3


@dataclass(frozen=True)
class Verdict:
    passed: bool
    tolerance: float | None
    reason: str


def verdict(kernel_rel_err: float | None, baseline_rel_err: float, kernel_finite: bool) -> Verdict:
    """Pure decision: the kernelized error may be at most 1.5x the baseline's plus a floor."""
    if not math.isfinite(baseline_rel_err):
        return Verdict(False, None, "the bf16 baseline's logits are not finite")
    tolerance = REL_ERR_FACTOR * baseline_rel_err + REL_ERR_FLOOR
    if kernel_rel_err is None:
        return Verdict(True, None, "cuTile not measured: only the bf16 baseline was checked")
    if not kernel_finite or not math.isfinite(kernel_rel_err):
        return Verdict(False, tolerance, "the kernelized logits contain NaN or Inf")
    if kernel_rel_err > tolerance:
        return Verdict(
            False, tolerance, f"kernelized rel err {kernel_rel_err:.3e} > tolerance {tolerance:.3e}"
        )
    return Verdict(True, tolerance, f"kernelized rel err {kernel_rel_err:.3e} <= {tolerance:.3e}")
