"""Sequential paired sampling of base and head throughput (docs/DESIGN.md, "Decision", rule 9).

The fixed scheme measured one head and one base benchmark and, when the throughput ratio was
in doubt, both again once with twice the runs. On hosts whose own speed swings 20-28%
(``docs/results/h200-2026-12-02-host-noise/``) that leaves a 5% slowdown kept in 7-36% of
replayed trials. Here the loop keeps adding *pairs*, one head and one base benchmark back to
back (their order alternating, head first in odd pairs, so a linear drift of the host falls on
both sides alike), pools every pair's runs of a side, and stops when the 95% interval of the
paired ratio r (``policy.throughput_ratio``: mean cuTile/PyTorch speedup of the head's runs
over the base's) is decisive against the margin, or when the next pair would not fit in the
time budget (the method's 15 minutes an experiment).

Decisive: the whole interval at or above ``1 - margin`` (not slower) or below it (slower). One
exception mirrors rule 9's rerun: a significant slowdown on the first pair while the GPU kernel
time per token fell is measured once more, since the kernels cannot explain it.

A pair is whole benchmarks (``tilegym-hf-bench`` processes): the harness is not changed, and a
benchmark's own timed runs are already interleaved PyTorch/cuTile pairs. Its fixed cost (model
build, compile and capture, correctness, the profiled run) is most of its time (63-88 s against
0.7-1.0 s a run in the replayed files), so runs are the cheap samples: each new pair asks for
``GROWTH`` (8) times the previous pair's runs a side, trimmed to what the remaining budget still
holds. Replayed on the committed noisy-host files, 1000 trials, growth 8 met both targets on all
four where growth 2 missed one, in fewer pairs
(``docs/results/sequential-sampling-replay/replay-c.md``).

Everything here is pure: ``next_step`` decides from the samples so far, ``assess`` applies it
(with the first-pair and later-pair short-cuts) to the metrics documents of the pairs so far,
``conclude`` is the verdict on them, ``replay_stop`` re-derives why a finished run of pairs
stopped, ``pool`` merges the metrics documents of several benchmarks of one commit,
``PairCost`` is the time model. Two loops benchmark: the local one
(``experiment._sample_sequentially``) and the GitHub workflow, which asks ``runner next-pair``
after each pair; the bot re-derives the stop from the uploaded pairs (``replay_stop``), so both
paths decide by the same rule. ``replay.replay_sequential`` runs the rule on measured runs.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from tilegym_bot.stats import RatioEstimate, mean, positive_mean_ci95

BUDGET_S = 900.0  # the method's 15 minutes an experiment (the runner's --timeout default too)
MAX_PAIRS = 8  # a bound of its own, whatever the time model says
GROWTH = 8  # each new pair has this many times the previous pair's runs a side

# why the sampling stopped (``Step.stopped``, ``sampling.stopped`` in the decision)
NOT_SLOWER = "decisive-not-slower"
SLOWER = "decisive-slower"
BUDGET = "budget"
MAX = "max-pairs"
NO_INTERVAL = "no-interval"
DECIDED = "decided-before-throughput"
PAIR_REJECTED = "pair-rejected"

RULE9 = "throughput ratio head/base"  # how the decision's rule-9 reasons start


@dataclass(frozen=True)
class PairCost:
    """Seconds of one benchmark: ``fixed_s`` + ``per_run_s`` a timed run (both sides of it)."""

    fixed_s: float
    per_run_s: float

    def job_s(self, runs: int) -> float:
        return self.fixed_s + runs * self.per_run_s

    def pair_s(self, runs: int) -> float:
        return 2.0 * self.job_s(runs)


def per_run_seconds(doc: Any) -> float | None:
    """The time of one timed run of a benchmark (its PyTorch and its cuTile ``generate()``),
    from the throughput samples: tokens / tok/s for each side. None when not computable."""
    from tilegym_bot.policy import _usable, dig

    tokens = (dig(doc, "workload", "batch_size") or 0) * (
        dig(doc, "workload", "output_length") or 0
    )
    if not isinstance(tokens, int) or tokens <= 0:
        return None
    total = 0.0
    for side in ("baseline", "cutile"):
        samples = _usable(dig(doc, side, "throughput", "samples"))
        if samples:
            total += tokens / mean(samples)
    return total or None


def cost_of(jobs: list[tuple[Any, float]]) -> PairCost | None:
    """The time model from benchmarks done so far: (metrics document, wall seconds) each. The
    per-run time comes from the samples, the fixed part is the largest wall time left over
    (the pessimistic one: the budget is a limit)."""
    fixed, per_run = [], []
    for doc, wall in jobs:
        if not (isinstance(wall, (int, float)) and math.isfinite(wall) and wall > 0):
            continue
        runs = _runs(doc)
        one = per_run_seconds(doc)
        if one is None or runs is None:
            fixed.append(float(wall))
            continue
        per_run.append(one)
        fixed.append(max(float(wall) - runs * one, 0.0))
    if not fixed:
        return None
    return PairCost(max(fixed), max(per_run) if per_run else 0.0)


def _runs(doc: Any) -> int | None:
    from tilegym_bot.policy import dig

    n = dig(doc, "workload", "timed_runs")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


@dataclass(frozen=True)
class Step:
    """What to do after ``pairs`` pairs: stop (and why), or measure a pair of ``runs`` a side."""

    stop: bool
    stopped: str | None  # one of the constants above when stopping
    why: str
    runs: int | None = None  # runs a side of the next pair when continuing


def decisive(estimate: RatioEstimate, margin: float) -> str | None:
    """``NOT_SLOWER`` / ``SLOWER`` when the 95% interval lies on one side of ``1 - margin``."""
    if estimate.ci95 is None:
        return None
    lo, hi = estimate.ci95
    floor = 1.0 - margin
    if lo >= floor:
        return NOT_SLOWER
    if hi < floor:
        return SLOWER
    return None


def _fmt(estimate: RatioEstimate) -> str:
    if estimate.ci95 is None:
        return f"r = {estimate.ratio:.3f} (no interval)"
    return f"r = {estimate.ratio:.3f} (95% CI {estimate.ci95[0]:.3f}–{estimate.ci95[1]:.3f})"


def next_step(
    estimate: RatioEstimate | None,
    *,
    margin: float,
    pairs: int,
    last_runs: int,
    first_runs: int,
    elapsed_s: float,
    cost: PairCost | None,
    budget_s: float = BUDGET_S,
    gpu_fell: bool = False,
    max_pairs: int = MAX_PAIRS,
) -> Step:
    """After ``pairs`` pairs (the last with ``last_runs`` runs a side, the first with
    ``first_runs``) taking ``elapsed_s`` so far: stop, or the runs a side of the next pair.

    ``estimate``: the pooled paired ratio head/base and its 95% CI (None: not computable, which
    more samples do not fix). ``cost``: the time model (None: unknown, so no second pair)."""
    if pairs < 1:
        raise ValueError(f"decide after at least one pair, got {pairs}")
    if estimate is None:
        return Step(True, NO_INTERVAL, "the throughput ratio is not computable")
    floor = 1.0 - margin
    verdict = decisive(estimate, margin)
    text = f"after {pairs} pair(s): {_fmt(estimate)} against {floor:.2f}"
    if verdict == NOT_SLOWER:
        return Step(True, NOT_SLOWER, f"{text}: the whole interval at or above it")
    if verdict == SLOWER and not (gpu_fell and pairs == 1):
        return Step(True, SLOWER, f"{text}: the whole interval below it")
    if verdict is None and estimate.ci95 is None and first_runs < 2:
        return Step(True, NO_INTERVAL, f"{text}: one run a side gives no interval")
    if pairs >= max_pairs:
        return Step(True, MAX, f"{text}: not decisive after the most pairs ({max_pairs})")
    if cost is None:
        return Step(True, BUDGET, f"{text}: not decisive, and no time model for another pair")
    left = budget_s - elapsed_s
    runs = max(first_runs, last_runs * GROWTH)
    while runs > first_runs and cost.pair_s(runs) > left:
        runs = max(first_runs, runs // 2)
    if cost.pair_s(runs) > left:
        return Step(
            True,
            BUDGET,
            f"{text}: not decisive, and another pair ({cost.pair_s(runs):.0f} s) does not fit "
            f"in the {left:.0f} s left of the {budget_s:.0f} s budget",
        )
    why = f"{text}: not decisive; next pair {runs} runs a side"
    if verdict == SLOWER:
        why = (
            f"{text}: below it while the GPU kernel time per token fell, so the slowdown is the "
            f"host's or the head's host work; next pair {runs} runs a side"
        )
    return Step(False, None, why, runs)


def pool(docs: list[Any]) -> Any:
    """One metrics document for several benchmarks of one commit: the first one's everything
    (its profile, correctness, environment), every benchmark's throughput samples a side in
    order, ``workload.timed_runs`` their count. Blocks are interleaved only when all were;
    sub-blocks (TTFT, decode tok/s) stay the first's. ``docs[0]`` alone is returned as is."""
    if not docs:
        raise ValueError("nothing to pool")
    if len(docs) == 1:
        return docs[0]
    out = copy.deepcopy(docs[0])
    total = 0
    for side in ("baseline", "cutile"):
        blocks = [d.get(side) if isinstance(d, dict) else None for d in docs]
        if not all(isinstance(b, dict) and isinstance(b.get("throughput"), dict) for b in blocks):
            continue
        samples: list[float] = []
        for b in blocks:
            got = b["throughput"].get("samples")
            samples += got if isinstance(got, list) else []
        tp = dict(out[side]["throughput"])
        finite = [v for v in samples if isinstance(v, (int, float)) and math.isfinite(v)]
        tp["samples"] = samples
        tp["mean"] = mean(finite) if finite and len(finite) == len(samples) else tp.get("mean")
        ci = positive_mean_ci95(finite) if len(finite) == len(samples) else None
        tp["ci95"] = list(ci) if ci else None
        tp["std"] = None
        if "interleaved" in tp:
            tp["interleaved"] = all(b["throughput"].get("interleaved") is True for b in blocks)
        out[side]["throughput"] = tp
        total = max(total, len(samples))
    if total and isinstance(out.get("workload"), dict):
        out["workload"]["timed_runs"] = total
    return out


def sampling_record(
    *,
    pairs: int,
    runs: tuple[int, int],
    stopped: str,
    why: str,
    seconds: float,
    budget_s: float,
) -> dict[str, Any]:
    """The decision's ``sampling`` object."""
    return {
        "pairs": pairs,
        "runs": {"base": runs[0], "head": runs[1]},
        "stopped": stopped,
        "why": why,
        "seconds": round(seconds, 1),
        "budget_s": budget_s,
    }


def _total_runs(docs: list[Any]) -> int:
    return sum(_runs(d) or 0 for d in docs)


def assess(
    bases: list[Any],
    heads: list[Any],
    *,
    margin: float,
    elapsed_s: float,
    budget_s: float,
    cost: PairCost | None,
    base_kernels: frozenset[str] | None = None,
    head_kernels: frozenset[str] | None = None,
    max_pairs: int = MAX_PAIRS,
) -> Step:
    """``next_step`` on the metrics documents of the pairs so far (pair k: ``bases[k-1]``,
    ``heads[k-1]``), with the short-cuts both loops share: a first pair that a rule before the
    throughput rule decides stops (``DECIDED``), and so does a later pair that fails rules 1-6
    on its own (``PAIR_REJECTED``, its first reason the why)."""
    from tilegym_bot.policy import decide, gate, throughput_ratio

    if not heads or len(bases) != len(heads):
        raise ValueError(f"pairs need a base and a head each: {len(bases)} and {len(heads)}")
    kernels = {"base_kernels": base_kernels, "head_kernels": head_kernels}
    first = decide(bases[0], heads[0], margin=margin, **kernels)
    if not any(r.startswith(RULE9) for r in first.reasons):
        return Step(True, DECIDED, f"decided by another rule: {first.status}")
    if len(heads) > 1 and (stop := gate(bases[-1], heads[-1], **kernels)):
        return Step(True, PAIR_REJECTED, stop.reasons[0])
    first_runs = _runs(heads[0]) or _runs(bases[0]) or 1
    last_runs = _runs(heads[-1]) or _runs(bases[-1]) or first_runs
    return next_step(
        throughput_ratio(pool(bases), pool(heads)).estimate,
        margin=margin,
        pairs=len(heads),
        last_runs=last_runs,
        first_runs=first_runs,
        elapsed_s=elapsed_s,
        cost=cost,
        budget_s=budget_s,
        gpu_fell=(
            first.gpu_ms_base is not None
            and first.gpu_ms_head is not None
            and first.gpu_ms_head < first.gpu_ms_base
        ),
        max_pairs=max_pairs,
    )


def conclude(
    bases: list[Any],
    heads: list[Any],
    step: Step,
    *,
    margin: float,
    seconds: float,
    budget_s: float,
    base_kernels: frozenset[str] | None = None,
    head_kernels: frozenset[str] | None = None,
) -> Any:
    """The verdict on the pairs once ``step`` stopped: ``decide`` on the pooled sides with the
    ``sampling`` record (``rerun``: no more samples come, unless another rule decided the first
    pair), or, for a rejected later pair, that pair's own rules-1-6 verdict."""
    from tilegym_bot.policy import decide, gate

    kernels = {"base_kernels": base_kernels, "head_kernels": head_kernels}
    record = sampling_record(
        pairs=len(heads),
        runs=(_total_runs(bases), _total_runs(heads)),
        stopped=step.stopped or "",
        why=step.why,
        seconds=seconds,
        budget_s=budget_s,
    )
    if step.stopped == PAIR_REJECTED:
        stop = gate(bases[-1], heads[-1], **kernels)
        if stop is None:
            raise ValueError("the last pair passes rules 1-6: it was not rejected")
        return replace(stop, sampling=record)
    return decide(
        pool(bases),
        pool(heads),
        margin=margin,
        rerun=step.stopped != DECIDED,
        sampling=record,
        **kernels,
    )


def _started(doc: Any) -> float | None:
    text = doc.get("started_at") if isinstance(doc, dict) else None
    try:
        return datetime.fromisoformat(text).timestamp() if isinstance(text, str) else None
    except ValueError:
        return None


def _wall(doc: Any) -> float | None:
    wall = doc.get("wall_s") if isinstance(doc, dict) else None
    ok = isinstance(wall, (int, float)) and not isinstance(wall, bool) and math.isfinite(wall)
    return float(wall) if ok and wall >= 0 else None


def walls_of(docs: list[Any]) -> list[tuple[Any, float]]:
    """(document, its own ``wall_s``) of each benchmark that has one: ``cost_of``'s input
    where only the files are at hand."""
    return [(d, w) for d in docs if (w := _wall(d))]


def span_s(docs: list[Any]) -> float:
    """Seconds from the first benchmark's start to the last one's end, by the files' own
    ``started_at`` + ``wall_s``; their summed ``wall_s`` when a start is missing."""
    walls = [_wall(d) or 0.0 for d in docs]
    starts = [s for d in docs if (s := _started(d)) is not None]
    if docs and len(starts) == len(docs):
        return max(s + w for s, w in zip(starts, walls, strict=True)) - min(starts)
    return math.fsum(walls)


def replay_stop(
    bases: list[Any],
    heads: list[Any],
    *,
    margin: float,
    budget_s: float,
    base_kernels: frozenset[str] | None = None,
    head_kernels: frozenset[str] | None = None,
) -> Step:
    """Why a finished run of pairs stopped, re-derived from its files (the GitHub bot does not
    take the benchmark job's word). Every earlier pair must have asked for more (ValueError
    naming the pair and the rule otherwise: pairs the rule would not have run); the last one is
    assessed with the files' own clock and time model, and when that still leaves room the
    workflow's own clock ran out (``BUDGET``)."""
    kernels = {"base_kernels": base_kernels, "head_kernels": head_kernels}
    endless = PairCost(0.0, 0.0)
    for k in range(1, len(heads)):
        step = assess(
            bases[:k],
            heads[:k],
            margin=margin,
            elapsed_s=0.0,
            budget_s=math.inf,
            cost=endless,
            **kernels,
        )
        if step.stop:
            raise ValueError(
                f"{len(heads)} pairs, but the sampling stops after pair {k} ({step.stopped}: "
                f"{step.why})"
            )
    docs = [*bases, *heads]
    step = assess(
        bases,
        heads,
        margin=margin,
        elapsed_s=span_s(docs),
        budget_s=budget_s,
        cost=cost_of(walls_of(docs)),
        **kernels,
    )
    if step.stop:
        return step
    asked = step.why.rsplit("; next pair", 1)[0]
    return Step(
        True,
        BUDGET,
        f"{asked}; the benchmark job's clock left no room for another pair in the "
        f"{budget_s:.0f} s budget",
    )
