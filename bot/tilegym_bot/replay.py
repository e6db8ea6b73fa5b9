"""Replay measured benchmark runs through the real keep/discard decision (``policy.decide``).

Pure: documents in, counts out, no I/O. One measured metrics document gives the per-run
throughput samples; each trial builds a synthetic base and head by resampling those runs, scales
the head's cuTile speed by a factor (1.0 = a throughput-neutral change, 0.95 = a 5% slowdown),
and asks ``policy.decide`` for the verdict, taking the loop's rerun path (rule 9: a first
``inconclusive`` is measured again with twice the runs a side and decided with ``rerun=True``).

What is resampled, and why: the statistic is what ``policy.throughput_ratio`` computes. When
the document's PyTorch and cuTile blocks are interleaved with equal counts, the policy reads per
run speedups s_i = cuTile_i / PyTorch_i, so the bootstrap draws whole runs (the pair
(PyTorch_i, cuTile_i) stays together): the drift the pairing cancels stays cancelled, as it is
on the machine. Otherwise the policy compares mean cuTile throughputs, and the bootstrap draws
runs of that side alone. Base and head draw independently, as two benchmark jobs would. A
bootstrap knows only the runs it is given: its spread is the measured one times sqrt((n-1)/n),
so at 3-5 runs the rates it reports lean optimistic.

Only rule 9 is under test, so every other rule must pass on every trial:

- correctness, coverage and GPU time per token come unchanged from the measured document;
- the head's coverage is raised by ``COVERAGE_NUDGE_PP`` by moving that share of GPU time from
  its largest non-cuTile kernel to its largest cuTile kernel: the total GPU time per token is
  unchanged (rule 7 passes with a +0.0% rise) and the non-cuTile time falls (rule 8 passes).
  Without it "the same code twice" is a rule-8 discard on every trial, by design (no coverage
  gain is never kept), which says nothing about throughput noise; ``Prepared.identical``
  records that decision.

A document that lacks a piece (a static-mode file with the cuTile side not measured) gets a
stand-in, listed in ``Prepared.notes``: the PyTorch side's samples for the cuTile side, a
two-kernel list for coverage, the baseline's error for the kernel's error.
"""

from __future__ import annotations

import copy
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tilegym_hf_bench.metrics_schema import validation_errors
from tilegym_hf_bench.profiling.attribution import recount
from tilegym_hf_bench.tolerance import verdict as tolerance_verdict

from tilegym_bot import policy, sequential
from tilegym_bot.stats import mean, positive_mean_ci95

NEUTRAL = 1.0
SLOWDOWN = 0.95
TARGET_SLOWDOWN_KEPT = 0.05  # a 5% slowdown is kept less often than this
TARGET_NEUTRAL_DISCARDED = 0.10  # a neutral change is discarded less often than this
TARGET_RUN_CV = 0.02  # per-run throughput CV a side, static mode
COVERAGE_NUDGE_PP = 0.05  # above policy.COVERAGE_MIN_GAIN_PP, small against any real kernel
_Z95 = 1.959963984540054
_Z90_ONE_SIDED = 1.2815515655446004
_Z95_ONE_SIDED = 1.6448536269514722
_RULE9 = "throughput ratio head/base"
_STANDIN_TOTAL_GPU_MS = 100.0


class ReplayError(ValueError):
    """The document cannot be replayed (why is the message)."""


def wilson(count: int, trials: int) -> tuple[float, float]:
    """Wilson 95% interval of a binomial rate: unlike the normal one it stays inside [0, 1]
    and is not empty at 0 or ``trials`` events, which is where the targets are judged."""
    if trials <= 0 or not 0 <= count <= trials:
        raise ValueError(f"need 0 <= count <= trials and trials > 0, got {count}/{trials}")
    p, z2 = count / trials, _Z95 * _Z95
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = _Z95 * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / (1 + z2 / trials)
    lo = 0.0 if count == 0 else max(0.0, centre - half)  # exact ends, not rounding residue
    hi = 1.0 if count == trials else min(1.0, centre + half)
    return lo, hi


@dataclass(frozen=True)
class Rate:
    count: int
    trials: int

    @property
    def rate(self) -> float:
        return self.count / self.trials

    @property
    def ci95(self) -> tuple[float, float]:
        return wilson(self.count, self.trials)

    def below(self, target: float) -> bool:
        """The whole 95% interval is below ``target``: shown, not just observed."""
        return self.ci95[1] < target


def cv(samples: list[float] | None) -> float | None:
    """Sample standard deviation over mean (None below two samples)."""
    if not samples or len(samples) < 2:
        return None
    m = mean(samples)
    return math.sqrt(math.fsum((v - m) ** 2 for v in samples) / (len(samples) - 1)) / m


@dataclass(frozen=True)
class Prepared:
    """The measured document made replayable: base and head templates and their run samples."""

    base: dict[str, Any]
    head: dict[str, Any]
    paired: bool  # the policy reads per-run speedups (else mean cuTile throughputs)
    runs: int  # measured runs a side
    statistic_samples: list[float]  # what the policy averages: speedups or cuTile tok/s
    cv_baseline: float | None
    cv_cutile: float | None
    identical: policy.Decision  # the document decided against itself, unchanged
    notes: tuple[str, ...] = ()

    @property
    def cv_statistic(self) -> float | None:
        return cv(self.statistic_samples)

    @property
    def mode(self) -> str:
        return policy.dig(self.base, "workload", "mode") or "eager"


def _samples(doc: Any, side: str) -> list[float] | None:
    return policy._usable(policy.dig(doc, side, "throughput", "samples"))


def _standin_symbol(function: str) -> str:
    """The symbol cuTile gives a launch of ``function`` (one bf16 2-D array argument)."""
    import cuda.tile as ct
    from cuda.tile.compilation import (
        ArrayConstraint,
        CallingConvention,
        KernelSignature,
        mangle_kernel_name,
    )

    array = ArrayConstraint(
        ct.bfloat16,
        2,
        index_dtype=ct.int32,
        stride_lower_bound_incl=0,
        alias_groups=[],
        may_alias_internally=False,
    )
    return mangle_kernel_name(
        function, KernelSignature([array], CallingConvention.cutile_python_v2())
    )


def _standin_coverage() -> dict[str, Any]:
    half = _STANDIN_TOTAL_GPU_MS / 2
    return {
        "gpu_time_pct": 50.0,
        "launch_pct": 50.0,
        "total_gpu_ms": _STANDIN_TOTAL_GPU_MS,
        "profiler": "torch",
        "kernels": [
            {
                "name": _standin_symbol("replay_standin_kernel"),
                "calls": 1,
                "gpu_ms": half,
                "cutile": True,
                "module": None,
            },
            {
                "name": "replay_standin_torch_kernel",
                "calls": 1,
                "gpu_ms": half,
                "cutile": False,
                "module": None,
            },
        ],
    }


def _fill_standins(doc: dict[str, Any]) -> list[str]:
    """Give ``doc`` what the decision needs and the measurement lacks; say what was put in."""
    notes = []
    if _samples(doc, "cutile") is None:
        if _samples(doc, "baseline") is None:
            raise ReplayError("no usable throughput samples on either side")
        block = copy.deepcopy(doc["baseline"])
        block["throughput"]["interleaved"] = False  # a side paired with itself says nothing
        doc["cutile"] = block
        notes.append(
            "cuTile side not measured: the PyTorch side's own samples stand for both sides "
            "(unpaired ratio of mean throughputs, the policy's rule for non-interleaved files)"
        )
    if not isinstance(doc.get("coverage"), dict):
        doc["coverage"] = _standin_coverage()
        notes.append(
            "coverage not measured: a stand-in two-kernel list (50% cuTile), the same GPU time "
            "per token on both sides"
        )
    correctness = doc.get("correctness")
    if (
        not isinstance(correctness, dict)
        or policy._finite(correctness.get("logits_rel_err")) is None
    ):
        base_err = policy._finite((correctness or {}).get("baseline_rel_err")) or 0.01
        doc["correctness"] = {
            "passed": True,
            "logits_rel_err": base_err,
            "baseline_rel_err": base_err,
            "tolerance": tolerance_verdict(base_err, base_err, True).tolerance,
            "top1_agreement": 1.0,
        }
        notes.append(
            "cuTile correctness not measured: the stand-in kernel error equals the PyTorch "
            f"baseline's ({base_err:.3g}), which passes"
        )
    return notes


def _nudged(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with ``COVERAGE_NUDGE_PP`` of its GPU time moved from the largest non-cuTile
    kernel to the largest cuTile kernel; total GPU time unchanged."""
    block = doc["coverage"]
    kernels = [dict(k) for k in block["kernels"]]
    total = math.fsum(k["gpu_ms"] for k in kernels)
    others = [k for k in kernels if not k["cutile"]]
    cutile = [k for k in kernels if k["cutile"]]
    delta = total * COVERAGE_NUDGE_PP / 100.0
    if not cutile or not others or max(k["gpu_ms"] for k in others) <= delta:
        raise ReplayError(
            "the kernel list has no cuTile kernel or no non-cuTile kernel to move "
            f"{COVERAGE_NUDGE_PP} pp of GPU time between, so no coverage gain can be simulated"
        )
    max(others, key=lambda k: k["gpu_ms"])["gpu_ms"] -= delta
    max(cutile, key=lambda k: k["gpu_ms"])["gpu_ms"] += delta
    flags = {k["name"]: k["cutile"] for k in kernels}
    fresh = recount({**block, "kernels": kernels}, lambda name: flags[name])
    head = dict(doc)
    head["coverage"] = {**block, "kernels": kernels, "gpu_time_pct": fresh["gpu_time_pct"]}
    return head


def prepare(doc: Any, *, margin: float = policy.DEFAULT_MARGIN) -> Prepared:
    """Check that ``doc`` can be replayed and build the templates (``doc`` is not changed).
    ReplayError when the decision on it would stop before the throughput rule."""
    if not isinstance(doc, dict):
        raise ReplayError("not a metrics document (a JSON object)")
    if errors := validation_errors(doc):
        raise ReplayError(f"metrics rejected by the schema: {errors[0]}")
    if doc["status"] != "ok":
        raise ReplayError(f"the benchmark ended with {doc['status']}: nothing was measured")
    if policy.dig(doc, "env", "gpu_name") is None:
        raise ReplayError("measured without a CUDA GPU: the decision cannot reach its rule 9")
    measured_cutile = _samples(doc, "cutile")
    doc = copy.deepcopy(doc)
    notes = _fill_standins(doc)
    baseline, cutile = _samples(doc, "baseline"), _samples(doc, "cutile")
    speedups = policy.speedup_samples(doc)
    head = _nudged(doc)
    check = policy.decide(doc, head, margin=margin)
    if not any(r.startswith(_RULE9) for r in check.reasons):
        raise ReplayError(
            f"the decision stops before the throughput rule on this file ({check.status}: "
            f"{check.reasons[0] if check.reasons else 'no reason'})"
        )
    if not math.isclose(check.gpu_ms_base or 0.0, check.gpu_ms_head or 0.0, rel_tol=1e-9):
        raise ReplayError("GPU time per token differs between the base and head templates")
    statistic = speedups if speedups is not None else cutile
    assert statistic is not None  # _fill_standins guarantees cuTile samples
    return Prepared(
        base=doc,
        head=head,
        paired=speedups is not None,
        runs=len(statistic),
        statistic_samples=statistic,
        cv_baseline=cv(baseline) if baseline is not None else None,
        cv_cutile=cv(measured_cutile),
        identical=policy.decide(doc, doc, margin=margin),
        notes=tuple(notes),
    )


def _resampled(block: dict[str, Any], idx: tuple[int, ...], runs: int, scale: float) -> dict:
    """The throughput block of one side with runs ``idx`` of the measured ``runs``, its speed
    scaled by ``scale``; sub-blocks with another sample count stay as measured."""
    out = dict(block)
    for key, factor in (
        ("throughput", scale),
        ("decode_tokens_per_s", scale),
        ("ttft_ms", 1 / scale),
    ):
        sub = block.get(key)
        if not isinstance(sub, dict) or not isinstance(sub.get("samples"), list):
            continue
        if len(sub["samples"]) != runs:
            continue
        picked = [sub["samples"][i] * factor for i in idx]
        new = {**sub, "samples": picked, "mean": mean(picked)}
        if key == "throughput":
            spread = cv(picked)
            ci = positive_mean_ci95(picked)
            new["std"] = None if spread is None else spread * new["mean"]
            new["ci95"] = list(ci) if ci else None
        out[key] = new
    return out


def _side(template: dict[str, Any], idx: tuple[int, ...], runs: int, factor: float) -> dict:
    """A synthetic metrics document: ``template`` with the measured runs ``idx``; only the
    cuTile side is scaled by ``factor``. Unchanged parts are shared, never mutated."""
    doc = dict(template)
    doc["workload"] = {**template["workload"], "timed_runs": len(idx)}
    for side, scale in (("baseline", 1.0), ("cutile", factor)):
        if isinstance(template.get(side), dict):
            doc[side] = _resampled(template[side], idx, runs, scale)
    return doc


@dataclass(frozen=True)
class ReplayResult:
    factor: float
    margin: float
    trials: int
    runs: int  # runs a side in the first round (the rerun has twice as many)
    final: dict[str, int]  # status after the rerun path
    first: dict[str, int]  # status of the first round
    reruns: int = field(default=0)

    def rate(self, status: str) -> Rate:
        return Rate(self.final.get(status, 0), self.trials)


def replay(
    prepared: Prepared,
    factor: float,
    *,
    trials: int = 2000,
    seed: int = 0,
    margin: float = policy.DEFAULT_MARGIN,
    runs: int | None = None,
) -> ReplayResult:
    """``trials`` bootstrap experiments with the head's cuTile speed times ``factor``.

    ``runs``: runs a side to draw (default: as measured). Decisions are memoised on the sorted
    drawn run indices: every quantity the policy reads (means, variances) is a sum over runs,
    exact (``math.fsum``) and so independent of run order.
    """
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"factor must be a finite positive number, got {factor}")
    measured = prepared.runs
    first_runs = measured if runs is None else runs
    if first_runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    rng = random.Random(seed)
    cache: dict[tuple, policy.Decision] = {}

    def draw(k: int) -> tuple[int, ...]:
        return tuple(sorted(rng.randrange(measured) for _ in range(k)))

    def decided(base_idx: tuple[int, ...], head_idx: tuple[int, ...], rerun: bool):
        key = (base_idx, head_idx, rerun)
        if key not in cache:
            cache[key] = policy.decide(
                _side(prepared.base, base_idx, measured, 1.0),
                _side(prepared.head, head_idx, measured, factor),
                margin=margin,
                rerun=rerun,
            )
        return cache[key]

    first: Counter[str] = Counter()
    final: Counter[str] = Counter()
    reruns = 0
    for _ in range(trials):
        decision = decided(draw(first_runs), draw(first_runs), False)
        first[decision.status] += 1
        if decision.rerun_useful:
            reruns += 1
            decision = decided(draw(2 * first_runs), draw(2 * first_runs), True)
        final[decision.status] += 1
    return ReplayResult(factor, margin, trials, first_runs, dict(final), dict(first), reruns)


def margin_window(cv_statistic: float, runs: int) -> tuple[float, float]:
    """Margins m for which both targets hold in a normal approximation of log r (base and head
    drawn from the same spread, ``runs`` a side, se = cv * sqrt(2 / runs)): a neutral change
    falls below 1 - m in less than 10% of first rounds (``lo``; the rerun only lowers that), and
    a 5% slowdown reaches 1 - m in less than 5% (``hi``). Empty (lo > hi) when no margin works
    at this spread; a guide for choosing, the replay is the check."""
    se = cv_statistic * math.sqrt(2.0 / runs)
    lo = 1.0 - math.exp(-_Z90_ONE_SIDED * se)
    hi = 1.0 - SLOWDOWN * math.exp(_Z95_ONE_SIDED * se)
    return lo, hi


def runs_needed(cv_statistic: float) -> int:
    """Fewest runs a side for which ``margin_window`` is not empty at this spread."""
    se_max = math.log(NEUTRAL / SLOWDOWN) / (_Z90_ONE_SIDED + _Z95_ONE_SIDED)
    return max(2, math.ceil(2.0 * (cv_statistic / se_max) ** 2))


@dataclass(frozen=True)
class SequentialResult:
    """``trials`` experiments through the sequential sampler (``sequential.next_step``)."""

    factor: float
    margin: float
    trials: int
    runs: int  # runs a side of the first pair
    budget_s: float
    cost: sequential.PairCost
    final: dict[str, int]
    stopped: dict[str, int]
    pairs: tuple[int, ...]  # per trial
    seconds: tuple[float, ...]  # per trial, by the time model

    def rate(self, status: str) -> Rate:
        return Rate(self.final.get(status, 0), self.trials)


def cost_model(prepared: Prepared) -> sequential.PairCost:
    """The time model of one benchmark of this file: its ``wall_s`` less its timed runs (the
    fixed part), and the time of a timed run from its throughput samples."""
    wall = policy._finite(prepared.base.get("wall_s"))
    cost = sequential.cost_of([(prepared.base, wall)]) if wall else None
    if cost is None:
        raise ReplayError("no wall_s in the file: the experiment time cannot be modelled")
    return cost


def fixed_seconds(cost: sequential.PairCost, runs: int, rerun: bool) -> float:
    """Today's fixed scheme: one pair of ``runs`` a side, a second of twice that on a rerun."""
    return cost.pair_s(runs) + (cost.pair_s(2 * runs) if rerun else 0.0)


def fixed_trial_seconds(result: ReplayResult, cost: sequential.PairCost) -> list[float]:
    """Modelled seconds of each trial of the fixed scheme: one pair, plus a pair of twice the
    runs for the trials whose first round went through the rerun."""
    once = fixed_seconds(cost, result.runs, False)
    twice = fixed_seconds(cost, result.runs, True)
    return [once] * (result.trials - result.reruns) + [twice] * result.reruns


def replay_sequential(
    prepared: Prepared,
    factor: float,
    *,
    trials: int = 2000,
    seed: int = 0,
    margin: float = policy.DEFAULT_MARGIN,
    runs: int | None = None,
    budget_s: float = sequential.BUDGET_S,
) -> SequentialResult:
    """``trials`` bootstrap experiments under sequential paired sampling: each pair draws its
    runs a side (``next_step``'s count) from the measured runs for base and head alike, the
    samples pool, and the stopping rule sees the pooled ratio and the modelled elapsed time;
    the final verdict is ``policy.decide`` on the pooled sides (no rerun round: ``rerun``)."""
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    measured = prepared.runs
    first_runs = measured if runs is None else runs
    cost = cost_model(prepared)
    rng = random.Random(seed)

    def draw(k: int) -> tuple[int, ...]:
        return tuple(rng.randrange(measured) for _ in range(k))

    final: Counter[str] = Counter()
    stopped: Counter[str] = Counter()
    pairs_seen, seconds_seen = [], []
    for _ in range(trials):
        base_idx, head_idx = draw(first_runs), draw(first_runs)
        pairs, last, elapsed = 1, first_runs, cost.pair_s(first_runs)
        while True:
            base = _side(prepared.base, base_idx, measured, 1.0)
            head = _side(prepared.head, head_idx, measured, factor)
            step = sequential.next_step(
                policy.throughput_ratio(base, head).estimate,
                margin=margin,
                pairs=pairs,
                last_runs=last,
                first_runs=first_runs,
                elapsed_s=elapsed,
                cost=cost,
                budget_s=budget_s,
            )
            if step.stop:
                break
            assert step.runs is not None
            base_idx += draw(step.runs)
            head_idx += draw(step.runs)
            pairs, last, elapsed = pairs + 1, step.runs, elapsed + cost.pair_s(step.runs)
        decision = policy.decide(base, head, margin=margin, rerun=True)
        final[decision.status] += 1
        stopped[step.stopped or ""] += 1
        pairs_seen.append(pairs)
        seconds_seen.append(elapsed)
    return SequentialResult(
        factor,
        margin,
        trials,
        first_runs,
        budget_s,
        cost,
        dict(final),
        dict(stopped),
        tuple(pairs_seen),
        tuple(seconds_seen),
    )
