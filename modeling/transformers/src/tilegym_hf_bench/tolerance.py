"""The correctness rule, torch-free: the benchmark applies it, and the bot applies it again to
the errors a metrics file records (a file's own ``passed`` is never taken on trust)."""

from __future__ import annotations

import math
from dataclasses import dataclass

REL_ERR_FACTOR = 1.5
REL_ERR_FLOOR = 1e-3
#: The bf16 baseline's own error above which fp32 cannot referee a kernel. The tolerance grows
#: with that error, and at 0.67 it passes a kernel returning zeros (error 1.0). The presets
#: measured 0.013-0.068 on the H200; gemma3 with its (1+w) norms initialized as if they were
#: plain scales measured 0.93 (`model_factory.init_random_` now initializes them as the model
#: does).
MAX_BASELINE_REL_ERR = 0.2


@dataclass(frozen=True)
class Verdict:
    passed: bool
    tolerance: float | None
    reason: str


def unusable_reference(baseline_rel_err: float) -> str | None:
    """Why fp32 cannot referee a kernel when the bf16 baseline is this far from it, or None."""
    if baseline_rel_err <= MAX_BASELINE_REL_ERR:
        return None
    return (
        f"the fp32 reference cannot referee: the bf16 baseline itself is "
        f"{baseline_rel_err:.3g} away from it (at most {MAX_BASELINE_REL_ERR} is usable; a "
        f"tolerance of {REL_ERR_FACTOR}x that would pass a wrong kernel); the model is "
        "numerically unstable in bf16 with these weights"
    )


def verdict(kernel_rel_err: float | None, baseline_rel_err: float, kernel_finite: bool) -> Verdict:
    """Pure decision: the kernelized error may be at most 1.5x the baseline's plus a floor, and
    only where the baseline's own error leaves fp32 able to tell a right kernel from a wrong one
    (`MAX_BASELINE_REL_ERR`)."""
    if not math.isfinite(baseline_rel_err):
        return Verdict(False, None, "the bf16 baseline's logits are not finite")
    tolerance = REL_ERR_FACTOR * baseline_rel_err + REL_ERR_FLOOR
    if kernel_rel_err is None:
        return Verdict(True, None, "cuTile not measured: only the bf16 baseline was checked")
    if why := unusable_reference(baseline_rel_err):
        return Verdict(False, None, why)
    if not kernel_finite or not math.isfinite(kernel_rel_err):
        return Verdict(False, tolerance, "the kernelized logits contain NaN or Inf")
    if kernel_rel_err > tolerance:
        return Verdict(
            False, tolerance, f"kernelized rel err {kernel_rel_err:.3e} > tolerance {tolerance:.3e}"
        )
    return Verdict(True, tolerance, f"kernelized rel err {kernel_rel_err:.3e} <= {tolerance:.3e}")
