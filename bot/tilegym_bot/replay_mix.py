"""How long the median experiment takes: the loop's real experiments replayed under both schemes.

``replay.replay_sequential`` times two hard cases (a 5% slowdown, a neutral change), the ones
sequential sampling has to sample longer for; most experiments the loop runs are not like
them (a new kernel moves throughput by 3-76% in the committed ledgers). The median experiment
is the median over the experiments the loop does run: every committed decision's measured
throughput ratio (``experiment_ratios``) becomes a factor, each factor gets ``trials``
bootstrap experiments on one noisy-host file under sequential sampling and under the fixed
scheme (one pair, a pair of twice the runs after a first ``inconclusive``), and the medians of
the two schemes' modelled durations are compared (``replay_mix``).

A measured ratio is itself a noisy estimate of the experiment's true effect; taken as the true
factor it spreads the mix a little wider than the truth, which moves both schemes alike.

Pure: decision documents and a prepared file in, durations out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tilegym_bot import policy, replay, sequential


def experiment_ratios(decisions: Iterable[Any]) -> list[float]:
    """The head/base throughput ratio of every decision that compared two measurements (a
    ledger's baseline row compares nothing and is skipped; so is a decision without a finite
    positive ratio)."""
    out = []
    for doc in decisions:
        if not isinstance(doc, dict) or doc.get("baseline") is True:
            continue
        ratio = (doc.get("throughput") or {}).get("ratio")
        if isinstance(ratio, (int, float)) and math.isfinite(ratio) and ratio > 0:
            out.append(float(ratio))
    return out


@dataclass(frozen=True)
class MixResult:
    """Every trial's modelled seconds under each scheme, over all factors."""

    factors: tuple[float, ...]
    trials: int  # a factor
    sequential_s: tuple[float, ...]
    fixed_s: tuple[float, ...]

    @property
    def median_sequential_s(self) -> float:
        return statistics.median(self.sequential_s)

    @property
    def median_fixed_s(self) -> float:
        return statistics.median(self.fixed_s)

    @property
    def not_longer(self) -> bool:
        """The issue's bar: the median experiment no longer than under the fixed scheme."""
        return self.median_sequential_s <= self.median_fixed_s


def replay_mix(
    prepared: replay.Prepared,
    factors: Iterable[float],
    *,
    trials: int = 40,
    seed: int = 0,
    margin: float = policy.DEFAULT_MARGIN,
    runs: int | None = None,
    budget_s: float = sequential.BUDGET_S,
) -> MixResult:
    """``trials`` experiments a factor under both schemes, each factor on its own seed."""
    factors = tuple(factors)
    if not factors:
        raise replay.ReplayError("no experiment ratios to replay")
    cost = replay.cost_model(prepared)
    seq_s: list[float] = []
    fixed_s: list[float] = []
    for i, factor in enumerate(factors):
        kw = dict(trials=trials, seed=seed + i, margin=margin, runs=runs)
        seq_s += replay.replay_sequential(prepared, factor, budget_s=budget_s, **kw).seconds
        fixed_s += replay.fixed_trial_seconds(replay.replay(prepared, factor, **kw), cost)
    return MixResult(factors, trials, tuple(seq_s), tuple(fixed_s))
