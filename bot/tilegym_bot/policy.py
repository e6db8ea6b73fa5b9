"""The keep/discard decision of docs/DESIGN.md ("Decision"), on two metrics documents. Pure.

Every number a rule reads is recomputed here from the raw data in the files: correctness from
the recorded errors with the trusted tolerance rule, coverage and GPU time from the kernel list
with the one classification rule and the kernel names of the measured trees (read by the caller
from the commits' sources). A file whose stored numbers disagree with that is refused.

Rules, in order (the first that applies decides):

1. head metrics fail the schema → ``inconclusive`` (rejected, never merged);
2. head ``crash`` / ``timeout`` / ``refused`` (its model worker did something the worker's
   confinement refuses) → that status;
3. base metrics fail the schema, base not ``ok``, or base and head not comparable (model key,
   workload lengths, GPU name and compute capability, profiler) → ``inconclusive``;
4. head correctness fails when recomputed → ``incorrect`` (not measured, or a reference that
   cannot referee because the bf16 model itself is far from fp32 → ``inconclusive``); on a
   CPU too: the worker runs the patched model there through the ops' references;
5. either side measured without a CUDA GPU → ``inconclusive`` (nothing to rerun);
6. stored coverage disagrees with the recomputed one → ``inconclusive`` (refused);
7. GPU kernel time per generated token above base by more than ``gpu_margin`` → ``discard``;
8. the change must earn its keep by one of two rules, else ``discard``:
   - *coverage*: coverage above base by more than 0.01 percentage points while the non-cuTile
     GPU time per token fell (work moved to cuTile, not slower cuTile kernels);
   - *speed*: GPU kernel time per token below base by more than the noise margin
     (``gpu_margin``, the same measured spread as rule 7) while the non-cuTile GPU time per
     token did not rise by more than that margin (no work moved back to PyTorch); coverage
     may fall (a faster cuTile kernel is a smaller share);
9. throughput ratio r (paired speedups when both files have interleaved baseline samples, else
   mean cuTile throughputs) with its 95% CI (``stats.ratio_of_means``): whole CI below
   1 − margin → ``discard`` (on a first round whose GPU kernel time per token fell,
   ``inconclusive`` and a rerun first: the slowdown is then the host's work or the host's
   speed); r ≥ 1 − margin → pass; otherwise ``inconclusive``, and on the rerun with twice the
   samples (``rerun=True``) ``discard``;
10. ``keep``, naming the rule of 8 that kept it (``Decision.kept_by``).

Only rule 9's statistical doubt asks for a rerun (``Decision.rerun_useful``) and is turned into
``discard`` by ``rerun``: a rejected file or an incomparable pair says nothing about the
experiment, so it stays ``inconclusive`` (the ledger records it as ``discard``; nothing merges).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tilegym_hf_bench.metrics_schema import validation_errors
from tilegym_hf_bench.profiling.attribution import recount
from tilegym_hf_bench.profiling.classify import KernelClassifier
from tilegym_hf_bench.tolerance import unusable_reference
from tilegym_hf_bench.tolerance import verdict as correctness_verdict

from tilegym_bot.stats import RatioEstimate, mean, ratio_of_means

STATUSES = ("keep", "discard", "incorrect", "refused", "inconclusive", "crash", "timeout")
LEDGER_STATUS = {
    "keep": "keep",
    "discard": "discard",
    "incorrect": "discard",
    "refused": "discard",
    "inconclusive": "discard",
    "crash": "crash",
    "timeout": "timeout",
}
DEFAULT_MARGIN = 0.02
# GPU kernel time per token may rise by at most this fraction: "no slower" within measurement
# noise. Profiled runs of the same code differ by at most 0.31% (H200, static mode, qwen3
# default workload: 1.3318-1.3360 ms/token over five runs on three hosts; llama 1.1908 vs
# 1.1948). At 2% a planted 3x QKV GEMM (+0.8% under a compiled decode step, which drops the
# two unused launches) was kept.
DEFAULT_GPU_TIME_MARGIN = 0.005
COVERAGE_MIN_GAIN_PP = 0.01
# Stored and recomputed coverage may differ by rounding only.
COVERAGE_RECOUNT_TOLERANCE_PP = 0.01
_MAX_SCHEMA_REASONS = 5


@dataclass(frozen=True)
class Decision:
    status: str
    reasons: tuple[str, ...]
    coverage_base: float | None = None
    coverage_head: float | None = None
    throughput_base: float | None = None
    throughput_head: float | None = None
    ratio: float | None = None
    ratio_ci95: tuple[float, float] | None = None
    baseline: bool = field(default=False)
    gpu_ms_base: float | None = None  # GPU kernel time per generated token
    gpu_ms_head: float | None = None
    non_cutile_ms_base: float | None = None  # ... of the kernels that are not cuTile
    non_cutile_ms_head: float | None = None
    rerun_useful: bool = False  # more samples could settle it (throughput doubt only)
    kept_by: str | None = None  # a keep: the rule 8 path that kept it ("coverage" | "speed")
    # how the loop's sequential sampling gathered the throughput samples (None: one round)
    sampling: dict[str, Any] | None = None

    @property
    def ledger_status(self) -> str:
        return LEDGER_STATUS[self.status]

    @property
    def ledger_marker(self) -> str:
        """What the ledger row appends to the description: the verdict recorded as a discard
        (`` [incorrect]``...), or `` [speed]`` for a keep by the speed rule (a keep without a
        marker was kept by the coverage rule)."""
        if self.status in ("incorrect", "refused", "inconclusive"):
            return f" [{self.status}]"
        return " [speed]" if self.status == "keep" and self.kept_by == "speed" else ""

    @property
    def coverage_delta_pp(self) -> float | None:
        if self.coverage_base is None or self.coverage_head is None:
            return None
        return _finite(self.coverage_head - self.coverage_base)

    def to_json(self) -> dict[str, Any]:
        """The DESIGN.md decision object (exactly its fields)."""
        return {
            "status": self.status,
            "ledger_status": self.ledger_status,
            "reasons": list(self.reasons),
            "coverage": {
                "base": self.coverage_base,
                "head": self.coverage_head,
                "delta_pp": self.coverage_delta_pp,
            },
            "throughput": {
                "base": self.throughput_base,
                "head": self.throughput_head,
                "ratio": self.ratio,
                "ratio_ci95": list(self.ratio_ci95) if self.ratio_ci95 else None,
            },
            "gpu_time_ms_per_token": {
                "base": self.gpu_ms_base,
                "head": self.gpu_ms_head,
                "non_cutile_base": self.non_cutile_ms_base,
                "non_cutile_head": self.non_cutile_ms_head,
            },
            "rerun": self.rerun_useful,
            "kept_by": self.kept_by,
            "sampling": self.sampling,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any], *, baseline: bool = False) -> Decision:
        ci = doc["throughput"]["ratio_ci95"]
        gpu = doc.get("gpu_time_ms_per_token") or {}
        return cls(
            gpu_ms_base=gpu.get("base"),
            gpu_ms_head=gpu.get("head"),
            non_cutile_ms_base=gpu.get("non_cutile_base"),
            non_cutile_ms_head=gpu.get("non_cutile_head"),
            rerun_useful=bool(doc.get("rerun", False)),
            kept_by=doc.get("kept_by"),
            sampling=doc.get("sampling"),
            status=doc["status"],
            reasons=tuple(doc["reasons"]),
            coverage_base=doc["coverage"]["base"],
            coverage_head=doc["coverage"]["head"],
            throughput_base=doc["throughput"]["base"],
            throughput_head=doc["throughput"]["head"],
            ratio=doc["throughput"]["ratio"],
            ratio_ci95=tuple(ci) if ci else None,
            baseline=baseline,
        )


def dig(doc: Any, *keys: str) -> Any:
    """``doc[k1][k2]...`` or None when any level is missing or not a mapping."""
    for key in keys:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _usable(samples: Any) -> list[float] | None:
    """The samples when all are finite and positive numbers, else None."""
    if not isinstance(samples, list) or not samples:
        return None
    values = [_finite(v) for v in samples]
    if any(v is None or v <= 0 for v in values):
        return None
    return values  # type: ignore[return-value]


def coverage_pct(doc: Any) -> float | None:
    return _finite(dig(doc, "coverage", "gpu_time_pct"))


def cutile_throughput(doc: Any) -> float | None:
    """Mean cuTile tokens/s: from the samples when usable, else the reported mean."""
    samples = _usable(dig(doc, "cutile", "throughput", "samples"))
    if samples:
        return mean(samples)
    return _finite(dig(doc, "cutile", "throughput", "mean"))


def speedup_samples(doc: Any) -> list[float] | None:
    """s_i = cuTile_i / baseline_i when both blocks are interleaved with equal sample counts."""
    base_tp = dig(doc, "baseline", "throughput")
    cut_tp = dig(doc, "cutile", "throughput")
    if not (isinstance(base_tp, dict) and isinstance(cut_tp, dict)):
        return None
    if base_tp.get("interleaved") is not True or cut_tp.get("interleaved") is not True:
        return None
    b, c = _usable(base_tp.get("samples")), _usable(cut_tp.get("samples"))
    if b is None or c is None or len(b) != len(c):
        return None
    return [ci / bi for ci, bi in zip(c, b, strict=True)]


@dataclass(frozen=True)
class _Ratio:
    estimate: RatioEstimate | None
    method: str
    problem: str | None


def _estimate(head: list[float], base: list[float], method: str) -> _Ratio:
    try:
        return _Ratio(ratio_of_means(head, base), method, None)
    except ValueError as exc:  # e.g. a speedup overflowing to inf
        return _Ratio(None, method, f"throughput ratio not computable ({exc}); rerun the benchmark")


def throughput_ratio(base: Any, head: Any) -> _Ratio:
    """r = head / base per DESIGN.md, with its CI, or the reason it cannot be computed."""
    s_base, s_head = speedup_samples(base), speedup_samples(head)
    if s_base is not None and s_head is not None:
        method = (
            f"paired speedups cuTile/PyTorch per run "
            f"({len(s_head)} head vs {len(s_base)} base runs)"
        )
        return _estimate(s_head, s_base, method)
    for side, doc in (("base", base), ("head", head)):
        samples = dig(doc, "cutile", "throughput", "samples")
        if isinstance(samples, list) and samples and _usable(samples) is None:
            return _Ratio(
                None,
                "",
                f"{side} cuTile throughput samples contain a non-finite or non-positive value "
                f"({samples}): the benchmark output is broken; rerun it",
            )
    a = _usable(dig(head, "cutile", "throughput", "samples"))
    b = _usable(dig(base, "cutile", "throughput", "samples"))
    if a and b:
        method = f"ratio of mean cuTile throughputs ({len(a)} head vs {len(b)} base runs)"
        return _estimate(a, b, method)
    ma, mb = cutile_throughput(head), cutile_throughput(base)
    if ma is not None and mb is not None and ma > 0 and mb > 0:
        method = "ratio of reported mean cuTile throughputs (no samples: no confidence interval)"
        return _Ratio(RatioEstimate(ma / mb, None), method, None)
    missing = [s for s, v in (("base", mb), ("head", ma)) if v is None or v <= 0]
    return _Ratio(
        None,
        "",
        f"no cuTile throughput measured on {' and '.join(missing)}: "
        "run the benchmark without --skip-cutile",
    )


def differences(base: Any, head: Any) -> list[str]:
    """Why base and head are not comparable (empty when they are)."""
    checks = [
        ("model key", ("model_key",)),
        ("batch size", ("workload", "batch_size")),
        ("input length", ("workload", "input_length")),
        ("output length", ("workload", "output_length")),
        ("GPU", ("env", "gpu_name")),
        ("compute capability", ("env", "compute_capability")),
    ]
    found = []
    for label, keys in checks:
        b, h = dig(base, *keys), dig(head, *keys)
        if b != h:
            found.append(f"{label} differs (base {b!r}, head {h!r})")
    for label, keys in (("workload", ("workload", "name")), ("profiler", ("coverage", "profiler"))):
        b, h = dig(base, *keys), dig(head, *keys)
        if b is not None and h is not None and b != h:
            found.append(f"{label} differs (base {b!r}, head {h!r})")
    # eager and static generate() time different things; a file without a mode (version 1 of
    # the metrics schema) ran eager
    b, h = (dig(doc, "workload", "mode") or "eager" for doc in (base, head))
    if b != h:
        found.append(f"mode differs (base {b!r}, head {h!r})")
    return found


def _fmt_ratio(est: RatioEstimate) -> str:
    if est.ci95 is None:
        return f"{est.ratio:.3f} (no 95% CI: fewer than two runs on a side)"
    lo, hi = est.ci95
    return f"{est.ratio:.3f} (95% CI {lo:.3f}–{hi:.3f})"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}%"


def _tps(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} tokens/s"


@dataclass(frozen=True)
class _Recounted:
    """A side's coverage recomputed from its kernel list, and what disagreed with the file."""

    pct: float | None = None
    gpu_ms_per_token: float | None = None
    non_cutile_ms_per_token: float | None = None
    problem: str | None = None


def _demangled_names(block: dict) -> frozenset[str]:
    """Without the measured tree: every function cuTile's demangler reads from the list."""
    any_tree = KernelClassifier()
    return frozenset(
        f for k in block["kernels"] if (f := any_tree.demangled_function(k["name"])) is not None
    )


def recount_coverage(doc: Any, kernel_names: frozenset[str] | None) -> _Recounted:
    """Coverage and GPU time per token from the kernel list, classified by the one rule with the
    measured tree's kernel names (every demangled name when they are not known)."""
    block = dig(doc, "coverage")
    if not isinstance(block, dict) or not isinstance(block.get("kernels"), list):
        return _Recounted()
    names = _demangled_names(block) if kernel_names is None else kernel_names
    classifier = KernelClassifier(names)
    if not classifier.can_demangle:
        return _Recounted(
            problem="cuda.tile.compilation is not importable where the bot runs, so coverage "
            "cannot be recomputed (install cuda-tile; it needs no GPU)"
        )
    try:
        fresh = recount(block, classifier.is_cutile)
    except (KeyError, TypeError) as exc:
        return _Recounted(problem=f"coverage kernel list is malformed ({exc})")
    tokens = (dig(doc, "workload", "batch_size") or 0) * (
        dig(doc, "workload", "output_length") or 0
    )
    total = fresh["total_gpu_ms"]
    cutile = sum(k["gpu_ms"] for k in fresh["kernels"] if k["cutile"])
    per_token = (total / tokens, (total - cutile) / tokens) if tokens > 0 else (None, None)
    problem = None
    flipped = [
        k["name"]
        for k, f in zip(block["kernels"], fresh["kernels"], strict=True)
        if bool(k.get("cutile")) != f["cutile"]
    ]
    stored = _finite(block.get("gpu_time_pct"))
    if flipped:
        problem = (
            f"{len(flipped)} kernel(s) marked cuTile/non-cuTile against the classification rule "
            f"and the measured tree's @ct.kernel functions, e.g. {flipped[0][:120]!r}"
        )
    elif stored is None or abs(stored - fresh["gpu_time_pct"]) > COVERAGE_RECOUNT_TOLERANCE_PP:
        problem = (
            f"stored coverage {_pct(stored)} but its own kernel list gives "
            f"{_pct(fresh['gpu_time_pct'])}"
        )
    return _Recounted(
        _finite(fresh["gpu_time_pct"]), _finite(per_token[0]), _finite(per_token[1]), problem
    )


def _summary(base: Any, head: Any, base_cov: _Recounted, head_cov: _Recounted) -> dict[str, Any]:
    ratio = throughput_ratio(base, head).estimate
    return {
        "coverage_base": base_cov.pct,
        "coverage_head": head_cov.pct,
        "throughput_base": cutile_throughput(base),
        "throughput_head": cutile_throughput(head),
        "ratio": ratio.ratio if ratio else None,
        "ratio_ci95": ratio.ci95 if ratio else None,
        "gpu_ms_base": base_cov.gpu_ms_per_token,
        "gpu_ms_head": head_cov.gpu_ms_per_token,
        "non_cutile_ms_base": base_cov.non_cutile_ms_per_token,
        "non_cutile_ms_head": head_cov.non_cutile_ms_per_token,
    }


def recheck_correctness(correctness: dict[str, Any]) -> tuple[bool | None, str | None]:
    """(passed, why not) from the recorded errors with the trusted tolerance rule; a file's own
    ``passed`` and ``tolerance`` count only where they are stricter. ``passed`` is None when the
    reference cannot referee (`tolerance.unusable_reference`): nothing is established."""
    kernel_err = _finite(correctness.get("logits_rel_err"))
    base_err = _finite(correctness.get("baseline_rel_err"))
    if base_err is None:
        return False, "the bf16 baseline's error against fp32 is not recorded or not finite"
    if why := unusable_reference(base_err):
        return None, why
    if kernel_err is None:
        return False, "the kernelized model's error is not recorded or not finite"
    rule = correctness_verdict(kernel_err, base_err, True)
    if not rule.passed:
        claimed = " (the file claims it passed)" if correctness.get("passed") else ""
        return (
            False,
            f"logits relative error {kernel_err:.4g} > tolerance {rule.tolerance:.4g}{claimed}",
        )
    if not correctness.get("passed"):
        return False, "the benchmark's own check failed"
    return True, None


def _schema_reasons(side: str, doc: Any) -> list[str]:
    errors = validation_errors(doc)
    if not errors:
        return []
    shown = [f"{side} metrics rejected by the schema: {e}" for e in errors[:_MAX_SCHEMA_REASONS]]
    if len(errors) > _MAX_SCHEMA_REASONS:
        shown.append(f"{side} metrics: {len(errors) - _MAX_SCHEMA_REASONS} more schema errors")
    shown.append(
        f"fix the {side} benchmark output and rerun; nothing is merged on rejected metrics"
    )
    return shown


def _crash_reason(side: str, doc: Any) -> str:
    error = dig(doc, "error") or "no error message recorded"
    return f"{side} benchmark ended with {doc['status']}: {error}; read its logs and fix the cause"


def _gpu_name(doc: Any) -> str | None:
    return dig(doc, "env", "gpu_name")


def _keep_path(summary: dict[str, Any], noise: float) -> tuple[str | None, str, tuple[str, ...]]:
    """Rule 8: (``"coverage"`` | ``"speed"``, what earned it, ()) or (None, "", why neither).

    coverage: up by more than ``COVERAGE_MIN_GAIN_PP`` while the non-cuTile GPU time per token
    fell. speed: the GPU kernel time per token fell by more than ``noise`` (the GPU-time
    tolerance, the measured spread of profiled runs of the same code) while the non-cuTile GPU
    time per token did not rise by more than ``noise`` of itself: a faster kernel, not work
    handed back to PyTorch. Coverage may fall on the speed path."""
    cov_b, cov_h = summary["coverage_base"], summary["coverage_head"]
    gpu_b, gpu_h = summary["gpu_ms_base"], summary["gpu_ms_head"]
    other_b, other_h = summary["non_cutile_ms_base"], summary["non_cutile_ms_head"]
    delta = cov_h - cov_b
    cov_text = f"coverage {_pct(cov_b)} → {_pct(cov_h)}"
    other_known = other_b is not None and other_h is not None
    if delta > COVERAGE_MIN_GAIN_PP and not (other_known and not other_h < other_b):
        return "coverage", f"{cov_text}: +{delta:.2f} pp", ()
    if delta > COVERAGE_MIN_GAIN_PP:
        why = (
            f"{cov_text}, but the non-cuTile GPU time per token did not fall ({other_b:.4f} → "
            f"{other_h:.4f} ms): the gain comes from cuTile kernels taking longer, not from "
            "moving work to cuTile"
        )
    else:
        why = (
            f"{cov_text}: no gain (needs more than +{COVERAGE_MIN_GAIN_PP} pp); "
            "kernelize one of the largest uncovered kernels"
        )
    if not (gpu_b and gpu_h is not None and other_known):
        return None, "", (why, "no GPU time per token on a side: the speed rule cannot apply")
    fall = 1.0 - gpu_h / gpu_b
    speed_text = (
        f"GPU kernel time per token {gpu_b:.4f} → {gpu_h:.4f} ms ({-fall:+.2%}, the speed rule "
        f"needs more than −{noise:.1%}, the measured noise margin)"
    )
    if not fall > noise:
        return None, "", (why, f"not a speedup either: {speed_text}")
    other_rise = other_h / other_b - 1.0 if other_b > 0 else (math.inf if other_h > 0 else 0.0)
    other_text = (
        f"non-cuTile GPU time per token {other_b:.4f} → {other_h:.4f} ms ({other_rise:+.2%}, "
        f"allowed +{noise:.1%})"
    )
    if other_rise > noise:
        return (
            None,
            "",
            (
                f"{speed_text}, but the {other_text}: the speedup moves work back to PyTorch; "
                "make the cuTile kernel faster instead",
                why,
            ),
        )
    return "speed", f"{speed_text}; {other_text}; {cov_text} ({delta:+.2f} pp)", ()


def decide(
    base: Any,
    head: Any,
    *,
    margin: float = DEFAULT_MARGIN,
    rerun: bool = False,
    gpu_margin: float = DEFAULT_GPU_TIME_MARGIN,
    base_kernels: frozenset[str] | None = None,
    head_kernels: frozenset[str] | None = None,
    sampling: dict[str, Any] | None = None,
) -> Decision:
    """Decide on head (the experiment) against base (main); both are parsed metrics documents.

    ``base_kernels`` / ``head_kernels``: the ``@ct.kernel`` names of each measured tree (read
    from the commits by the caller); None classifies every demangled cuTile symbol as cuTile.
    ``sampling``: how the loop's sequential sampling gathered the throughput samples
    (``sequential.sampling_record``), carried into the decision and its last reason.
    """
    decision = _decide(
        base,
        head,
        margin=margin,
        rerun=rerun,
        gpu_margin=gpu_margin,
        base_kernels=base_kernels,
        head_kernels=head_kernels,
        sampling=sampling,
        gate_only=False,
    )
    assert decision is not None
    return decision


def gate(
    base: Any,
    head: Any,
    *,
    base_kernels: frozenset[str] | None = None,
    head_kernels: frozenset[str] | None = None,
) -> Decision | None:
    """Rules 1-6 alone (schema, status, comparable, correctness, a GPU, coverage recount): the
    decision when one of them decides, else None. For the sequential sampler's later pairs,
    whose throughput samples join the first pair's: a crash, a failed correctness check or an
    incomparable run there decides as it would have on the first pair."""
    return _decide(
        base,
        head,
        margin=DEFAULT_MARGIN,
        rerun=False,
        gpu_margin=DEFAULT_GPU_TIME_MARGIN,
        base_kernels=base_kernels,
        head_kernels=head_kernels,
        sampling=None,
        gate_only=True,
    )


def _sampling_reason(sampling: dict[str, Any]) -> str:
    runs = sampling.get("runs") or {}
    return (
        f"sampling: {sampling.get('pairs')} base/head pair(s), {runs.get('base')} base and "
        f"{runs.get('head')} head runs pooled, {sampling.get('seconds')} s of a "
        f"{sampling.get('budget_s')} s budget; stopped: {sampling.get('stopped')} "
        f"({sampling.get('why')})"
    )


def _decide(
    base: Any,
    head: Any,
    *,
    margin: float,
    rerun: bool,
    gpu_margin: float,
    base_kernels: frozenset[str] | None,
    head_kernels: frozenset[str] | None,
    sampling: dict[str, Any] | None,
    gate_only: bool,
) -> Decision | None:
    for name, value in (("margin", margin), ("gpu_margin", gpu_margin)):
        if not math.isfinite(value) or not (0.0 <= value < 1.0):
            raise ValueError(f"{name} must be in [0, 1), got {value}")
    base_cov, head_cov = recount_coverage(base, base_kernels), recount_coverage(head, head_kernels)
    summary = _summary(base, head, base_cov, head_cov)

    def verdict(
        status: str, *reasons: str, rerun_useful: bool = False, kept_by: str | None = None
    ) -> Decision:
        if sampling is not None:
            reasons = (*reasons, _sampling_reason(sampling))
        return Decision(
            status,
            tuple(reasons),
            **summary,
            rerun_useful=rerun_useful,
            kept_by=kept_by,
            sampling=sampling,
        )

    if reasons := _schema_reasons("head", head):
        return verdict("inconclusive", *reasons)
    if head["status"] in ("crash", "timeout", "refused"):
        return verdict(head["status"], _crash_reason("head", head))
    if reasons := _schema_reasons("base", base):
        return verdict("inconclusive", *reasons)
    if base["status"] != "ok":
        return verdict(
            "inconclusive",
            _crash_reason("base", base) + ": without a base measurement nothing can be compared",
        )
    if diffs := differences(base, head):
        return verdict(
            "inconclusive",
            *[f"not comparable: {d}" for d in diffs],
            "benchmark base and head with the same model, workload and GPU",
        )
    correctness = head["correctness"]
    if correctness is None:
        return verdict(
            "inconclusive",
            "head correctness was not measured: cannot keep a kernel whose output is unchecked",
        )
    passed, why = recheck_correctness(correctness)
    if passed is None:
        return verdict(
            "inconclusive",
            f"correctness cannot be established: {why}; measure on weights (or a preset) where "
            "the bf16 model tracks fp32",
        )
    if not passed:
        return verdict(
            "incorrect",
            f"head output is incorrect: {why} (PyTorch bf16's own error "
            f"{correctness['baseline_rel_err']}, top-1 agreement "
            f"{correctness['top1_agreement']}); fix the kernel before measuring speed",
        )
    if _gpu_name(base) is None or _gpu_name(head) is None:
        return verdict(
            "inconclusive",
            "benchmarked without a CUDA GPU: cuTile throughput, kernel coverage and GPU time "
            "can only be measured on one, so nothing can be decided (a rerun would not help); "
            "run the loop on a GPU host",
        )

    for side, cov in (("base", base_cov), ("head", head_cov)):
        if cov.problem:
            return verdict(
                "inconclusive",
                f"{side} metrics refused: {cov.problem}; only numbers the bot can recompute "
                "from the raw kernel list are accepted",
            )
    cov_b, cov_h = summary["coverage_base"], summary["coverage_head"]
    if cov_b is None or cov_h is None:
        missing = [s for s, v in (("base", cov_b), ("head", cov_h)) if v is None]
        return verdict(
            "inconclusive",
            f"no cuTile coverage measured on {' and '.join(missing)}: "
            "the benchmark ran with --skip-coverage or its profiler failed; see its log",
        )
    if gate_only:
        return None

    gpu_b, gpu_h = summary["gpu_ms_base"], summary["gpu_ms_head"]
    gpu_reason = None
    if gpu_b and gpu_h is not None:
        rise = gpu_h / gpu_b - 1.0
        gpu_text = (
            f"GPU kernel time per token {gpu_b:.4f} → {gpu_h:.4f} ms ({rise:+.1%}, "
            f"allowed +{gpu_margin:.1%})"
        )
        if rise > gpu_margin:
            return verdict(
                "discard",
                f"{gpu_text}: the kernels got slower; make the new kernel at least as fast as "
                "the code it replaces",
            )
        gpu_reason = gpu_text

    path, path_reason, why_not = _keep_path(summary, gpu_margin)
    if path is None:
        return verdict("discard", *why_not)

    ratio = throughput_ratio(base, head)
    if ratio.estimate is None:
        return verdict("inconclusive", path_reason, str(ratio.problem))
    est, floor = ratio.estimate, 1.0 - margin
    tp_text = f"throughput ratio head/base {_fmt_ratio(est)}, {ratio.method}"
    gpu_fell = gpu_b is not None and gpu_h is not None and gpu_h < gpu_b
    if est.ci95 is not None and est.ci95[1] < floor and gpu_fell and not rerun:
        return verdict(
            "inconclusive",
            path_reason,
            f"{tp_text}: the whole interval lies below {floor:.2f}, but the GPU kernel time per "
            f"token fell ({gpu_b:.4f} → {gpu_h:.4f} ms): the slowdown is not in the kernels, so "
            "either the head's host work grew or the host ran the two benchmarks at different "
            "speeds; rerun both sides with twice the samples",
            rerun_useful=True,
        )
    if est.ci95 is not None and est.ci95[1] < floor:
        return verdict(
            "discard",
            path_reason,
            f"{tp_text}: the whole interval lies below {floor:.2f}, a significant slowdown; "
            "make the kernel faster than the PyTorch code it replaces",
        )
    if est.ratio < floor:
        if rerun:
            return verdict(
                "discard",
                path_reason,
                f"{tp_text}: below {floor:.2f} and still not significant after "
                + (
                    "the sequential sampling stopped"
                    if sampling is not None
                    else "the rerun with twice the samples"
                )
                + ": recorded as discard",
            )
        return verdict(
            "inconclusive",
            path_reason,
            f"{tp_text}: below {floor:.2f} but the drop is not significant; "
            "rerun both sides with twice the samples",
            rerun_useful=True,
        )
    return verdict(
        "keep",
        f"kept by the {path} rule: {path_reason}",
        *([gpu_reason] if gpu_reason else []),
        f"{tp_text}: not below {floor:.2f}, no significant drop",
        "correctness passed (logits relative error "
        f"{correctness['logits_rel_err']} within the recomputed tolerance)",
        kept_by=path,
    )


def decide_baseline(doc: Any, *, kernels: frozenset[str] | None = None) -> Decision:
    """The first measurement of a model's main: recorded as is (``keep``) unless it failed.
    Its coverage too is recomputed from the kernel list (``kernels``: see ``decide``)."""
    recounted = recount_coverage(doc, kernels)
    values = {
        "coverage_head": recounted.pct,
        "throughput_head": cutile_throughput(doc),
        "gpu_ms_head": recounted.gpu_ms_per_token,
        "non_cutile_ms_head": recounted.non_cutile_ms_per_token,
        "baseline": True,
    }
    if reasons := _schema_reasons("baseline", doc):
        return Decision("inconclusive", tuple(reasons), **values)
    if doc["status"] != "ok":
        return Decision(doc["status"], (_crash_reason("baseline", doc),), **values)
    if recounted.problem:
        reason = f"baseline metrics refused: {recounted.problem}"
        return Decision("inconclusive", (reason,), **values)
    reasons = [
        f"baseline: main measured as is (coverage {_pct(values['coverage_head'])}, cuTile "
        f"throughput {_tps(values['throughput_head'])}); later experiments are compared with main"
    ]
    correctness = doc["correctness"]
    if correctness is not None and not correctness["passed"]:
        reasons.append("warning: main itself fails the correctness check; fix main first")
    return Decision("keep", tuple(reasons), **values)
