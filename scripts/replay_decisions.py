"""Replay measured benchmark runs through the keep/discard decision and print a markdown report.

For each metrics.json: the per-run CV of each side, then ``--trials`` bootstrap experiments at a
5% slowdown and at a neutral change through the real ``policy.decide`` (with the loop's rerun
path), and whether the targets hold: a 5% slowdown kept < 5% of the time, a neutral change
discarded < 10% (judged on the upper end of the rate's 95% interval). The method is in
``tilegym_bot.replay``.

    python scripts/replay_decisions.py docs/results/.../metrics.json [...] [--check]
        [--sequential [--mix DECISIONS_OR_DIRS ...]]

``--mix`` also replays the committed experiments' measured ratios (``*.decision.json`` files,
directories searched for them) through both schemes on each file and compares the median
experiment's modelled time (``tilegym_bot.replay_mix``); with ``--check`` a longer median
under sequential sampling fails too.

Exit status: 0, or 1 with ``--check`` when a target fails; 2 for bad input (one ``error:`` line).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from tilegym_bot import policy, replay_mix
from tilegym_bot import replay as rp

_STATIC_RUNS = 5  # --timed-runs of docs/results/static-h200-2026-12-01/static-qwen3.json


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _margins(text: str) -> list[float]:
    values = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {part!r}") from None
        if not 0 <= value < 1:
            raise argparse.ArgumentTypeError(f"a margin must be in [0, 1), got {part}")
        values.append(value)
    return values


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="replay_decisions.py",
        description="Replay measured runs through the keep/discard decision (markdown on stdout).",
    )
    p.add_argument("files", nargs="+", type=Path, help="metrics.json files (measured)")
    p.add_argument("--trials", type=_positive_int, default=2000, help="per factor (2000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slowdown", type=_factor, default=rp.SLOWDOWN, help="factor (0.95)")
    p.add_argument("--neutral", type=_factor, default=rp.NEUTRAL, help="factor (1.0)")
    p.add_argument(
        "--margins",
        type=_margins,
        default=[policy.DEFAULT_MARGIN],
        help=f"comma-separated decision margins (policy default {policy.DEFAULT_MARGIN})",
    )
    p.add_argument(
        "--runs", type=_positive_int, default=None, help="runs a side to draw (default: measured)"
    )
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds of the sequential sampler's budget an experiment (default "
        f"{rp.sequential.BUDGET_S:g}); with --sequential",
    )
    p.add_argument(
        "--sequential",
        action="store_true",
        help="also replay the sequential paired sampling (the loop's default) against the "
        "fixed scheme: rates, pairs and modelled experiment time",
    )
    p.add_argument(
        "--mix",
        nargs="+",
        type=Path,
        default=None,
        help="decision.json files or directories: replay their measured ratios (with --sequential)",
    )
    p.add_argument(
        "--mix-trials", type=_positive_int, default=40, help="trials a ratio with --mix (40)"
    )
    p.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    return p


def _pct(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{100 * value:.{digits}f}%"


def _rate(rate: rp.Rate) -> str:
    lo, hi = rate.ci95
    return f"{_pct(rate.rate)} [{_pct(lo)}, {_pct(hi)}]"


def _failures(slow, neutral) -> list[str]:
    out = []
    if not slow.rate("keep").below(rp.TARGET_SLOWDOWN_KEPT):
        out.append("slowdown kept")
    if not neutral.rate("discard").below(rp.TARGET_NEUTRAL_DISCARDED):
        out.append("neutral discarded")
    return out


@dataclass(frozen=True)
class _Row:
    path: Path
    prepared: rp.Prepared
    margin: float
    slow: rp.ReplayResult
    neutral: rp.ReplayResult
    seq_slow: rp.SequentialResult | None = None
    seq_neutral: rp.SequentialResult | None = None
    mix: replay_mix.MixResult | None = None

    @property
    def failures(self) -> list[str]:
        out = _failures(self.slow, self.neutral)
        if self.seq_slow is not None and self.seq_neutral is not None:
            out += [f"sequential: {f}" for f in _failures(self.seq_slow, self.seq_neutral)]
        if self.mix is not None and not self.mix.not_longer:
            out.append("sequential: the median experiment is longer")
        return out


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def _fixed_lists(result: rp.ReplayResult, cost) -> tuple[list[float], list[float]]:
    """Pairs and modelled seconds per trial of today's fixed scheme (one pair, a rerun pair of
    twice the runs on a first ``inconclusive``)."""
    pairs = [1.0] * (result.trials - result.reruns) + [2.0] * result.reruns
    return pairs, rp.fixed_trial_seconds(result, cost)


def _stops(result: rp.SequentialResult) -> str:
    return ", ".join(f"{k} {_pct(v / result.trials, 0)}" for k, v in sorted(result.stopped.items()))


def _sequential_table(rows: list[_Row], args: argparse.Namespace) -> list[str]:
    head = (
        "| file | first pair: runs a side | benchmark s (fixed + per run) | "
        f"{args.slowdown:g}x kept [95% CI] | {args.neutral:g}x discarded [95% CI] | "
        f"median pairs {args.slowdown:g}x / {args.neutral:g}x (fixed scheme) | "
        f"median min {args.slowdown:g}x / {args.neutral:g}x (fixed scheme) | "
        f"{args.slowdown:g}x stopped | {args.neutral:g}x stopped | targets |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        ss, sn = r.seq_slow, r.seq_neutral
        if ss is None or sn is None:
            continue
        fp_s, fs_s = _fixed_lists(r.slow, ss.cost)
        fp_n, fs_n = _fixed_lists(r.neutral, sn.cost)
        failures = _failures(ss, sn)
        lines.append(
            f"| `{r.path}` | {ss.runs} | {ss.cost.fixed_s:.0f} + {ss.cost.per_run_s:.2f} | "
            f"{_rate(ss.rate('keep'))} | {_rate(sn.rate('discard'))} | "
            f"{_median(list(ss.pairs)):g} / {_median(list(sn.pairs)):g} "
            f"({_median(fp_s):g} / {_median(fp_n):g}) | "
            f"{_median(list(ss.seconds)) / 60:.1f} / {_median(list(sn.seconds)) / 60:.1f} "
            f"({_median(fs_s) / 60:.1f} / {_median(fs_n) / 60:.1f}) | "
            f"{_stops(ss)} | {_stops(sn)} | "
            f"{'pass' if not failures else 'FAIL: ' + ', '.join(failures)} |"
        )
    return lines


def _sequential_section(rows: list[_Row], args: argparse.Namespace) -> list[str]:
    budget = args.budget if args.budget is not None else rp.sequential.BUDGET_S
    return [
        "",
        "## Sequential paired sampling (the loop's default)",
        "",
        f"Each trial starts with one base/head pair of the same runs a side as above, then, "
        f"while the pooled paired ratio's 95% CI straddles 1 − margin, adds pairs of "
        f"{rp.sequential.GROWTH}x the previous pair's runs a side (trimmed to what fits) until "
        f"the CI is decisive or the next pair would pass the {budget:g} s budget "
        f"(`tilegym_bot.sequential.next_step`); every pair's runs are drawn from the file like "
        f"the first's, and the final verdict is `policy.decide` on the pooled sides. Time is "
        f"modelled, not measured: a benchmark takes the file's `wall_s` less its timed runs "
        f"(the fixed part), plus, a run, the file's mean PyTorch + cuTile `generate()` time; "
        f"a pair is two benchmarks (a reused base is not modelled, on either scheme). The "
        f"fixed scheme is the table above: one pair, and a pair of twice the runs after a "
        f"first `inconclusive`. Same seed and trials.",
        "",
        *_sequential_table(rows, args),
    ]


def _quantile(values: tuple[float, ...], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _mix_section(rows: list[_Row], args: argparse.Namespace, ratios: list[float]) -> list[str]:
    lines = [
        "",
        "## The median experiment",
        "",
        f"The {len(ratios)} committed experiments' measured head/base throughput ratios "
        f"(min {min(ratios):.3f}, median {_median(ratios):.3f}, max {max(ratios):.3f}; "
        f"baseline rows skipped) replayed as factors on each file, {args.mix_trials} trials a "
        f"ratio under each scheme, the same time model as above "
        f"(`tilegym_bot.replay_mix`). The bar: the median experiment under sequential "
        f"sampling no longer than under the fixed scheme.",
        "",
        "| file | median min, sequential (fixed scheme) | 75th percentile min (fixed) | "
        "90th percentile min (fixed) | median not longer |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        m = r.mix
        if m is None:
            continue
        cells = [
            f"{_quantile(m.sequential_s, q) / 60:.1f} ({_quantile(m.fixed_s, q) / 60:.1f})"
            for q in (0.75, 0.9)
        ]
        lines.append(
            f"| `{r.path}` | {m.median_sequential_s / 60:.1f} ({m.median_fixed_s / 60:.1f}) | "
            f"{cells[0]} | {cells[1]} | {'yes' if m.not_longer else 'no'} |"
        )
    return lines


def _decision_files(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.rglob("*.decision.json"))
            if not found:
                raise rp.ReplayError(f"{path}: no *.decision.json under it")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise rp.ReplayError(f"{path}: no such file or directory")
    return files


def _load_ratios(paths: list[Path]) -> list[float]:
    docs = []
    for path in _decision_files(paths):
        try:
            docs.append(json.loads(path.read_text()))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise rp.ReplayError(f"{path}: not a readable JSON decision ({exc})") from None
    ratios = replay_mix.experiment_ratios(docs)
    if not ratios:
        raise rp.ReplayError("--mix: no decision with a throughput ratio")
    return ratios


def _load(path: Path) -> rp.Prepared:
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise rp.ReplayError(exc.strerror or str(exc)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise rp.ReplayError(f"not JSON ({exc})") from None
    return rp.prepare(doc)


def _table(rows: list[_Row], args: argparse.Namespace) -> list[str]:
    head = (
        "| file | mode | runs a side | statistic | run CV PyTorch | run CV cuTile | "
        f"CV of the statistic | margin | {args.slowdown:g}x kept [95% CI] | "
        f"{args.neutral:g}x discarded [95% CI] | reruns ({args.slowdown:g}x / {args.neutral:g}x) "
        "| targets |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        p = r.prepared
        standin = any(n.startswith("cuTile side not measured") for n in p.notes)
        lines.append(
            f"| `{r.path}` | {p.mode} | {r.slow.runs} | "
            f"{'paired speedups' if p.paired else 'mean cuTile tok/s'} | "
            f"{_pct(p.cv_baseline, 2)} | "
            f"{'not measured' if standin else _pct(p.cv_cutile, 2)} | "
            f"{_pct(p.cv_statistic, 2)} | {r.margin:g} | {_rate(r.slow.rate('keep'))} | "
            f"{_rate(r.neutral.rate('discard'))} | "
            f"{_pct(r.slow.reruns / r.slow.trials, 0)} / "
            f"{_pct(r.neutral.reruns / r.neutral.trials, 0)} | "
            f"{'pass' if not r.failures else 'FAIL: ' + ', '.join(r.failures)} |"
        )
    return lines


def _file_notes(path: Path, p: rp.Prepared, runs: int) -> list[str]:
    lines = [f"- `{path}`:"]
    lines += [f"  - stand-in: {n}" for n in p.notes]
    cvs = [(side, v) for side, v in (("PyTorch", p.cv_baseline), ("cuTile", p.cv_cutile)) if v]
    if cvs:
        verdicts = ", ".join(
            f"{side} {_pct(v, 2)} ({'within' if v <= rp.TARGET_RUN_CV else 'above'} "
            f"{_pct(rp.TARGET_RUN_CV, 0)})"
            for side, v in cvs
        )
        lines.append(f"  - run CV: {verdicts}")
    reason = p.identical.reasons[0] if p.identical.reasons else ""
    lines.append(f"  - the document against itself, unchanged: `{p.identical.status}` ({reason})")
    cv_stat = p.cv_statistic
    if cv_stat:
        window = _window_text(cv_stat, runs)
        lines.append(
            f"  - normal approximation at CV {_pct(cv_stat, 2)} and {runs} runs a side: {window}; "
            f"runs a side needed for a non-empty window: {rp.runs_needed(cv_stat)}"
        )
    return lines


def _window_text(cv_stat: float, runs: int) -> str:
    lo, hi = rp.margin_window(cv_stat, runs)
    if lo <= hi:
        return f"margins {lo:.4f} to {hi:.4f} meet both targets"
    return f"no margin meets both targets (lower bound {lo:.4f} > upper bound {hi:.4f})"


def _target_cv_sentence() -> str:
    """What the run-CV target means for the margin, at the static measurement's run count."""
    target, runs = rp.TARGET_RUN_CV, _STATIC_RUNS
    paired = target * 2**0.5  # two independent sides at the target, per-run speedups
    return (
        f"At the target run CV of {_pct(target, 0)} a side and {runs} runs a side (the static "
        f"measurement's count), the normal approximation gives: mean throughputs (statistic CV "
        f"{_pct(target, 1)}): {_window_text(target, runs)}; paired speedups with independent "
        f"sides (statistic CV {_pct(paired, 2)}): {_window_text(paired, runs)}, "
        f"{rp.runs_needed(paired)} runs a side needed, at 10 runs {_window_text(paired, 10)}. "
        "A drift shared by both sides of a run lowers the speedups' CV below that."
    )


def report(
    rows: list[_Row], args: argparse.Namespace, argv: list[str], ratios: list[float] | None = None
) -> str:
    command = shlex.join(["python", "scripts/replay_decisions.py", *argv])
    lines = [
        "# Decision replay: measured run noise through the keep/discard decision",
        "",
        f"Command: `{command}`",
        "",
        f"Each trial draws a base and a head with replacement from the file's measured runs "
        f"(whole runs: PyTorch and cuTile of run i together when the file is interleaved, as "
        f"the policy's paired speedups read them), multiplies the head's cuTile samples by the "
        f"factor ({args.slowdown:g} = a 5% slowdown, {args.neutral:g} = neutral) and runs the "
        f"real `tilegym_bot.policy.decide`; a first `inconclusive` is redrawn with twice the "
        f"runs a side and decided with `rerun=True`, as the loop does. {args.trials} trials a "
        f"factor, seed {args.seed}; rates with Wilson 95% intervals. A target passes when the "
        f"whole interval is below it (slowdown kept < {_pct(rp.TARGET_SLOWDOWN_KEPT, 0)}, "
        f"neutral discarded < {_pct(rp.TARGET_NEUTRAL_DISCARDED, 0)}).",
        "",
        f"Only the throughput rule (rule 9) decides: correctness and GPU time per token are the "
        f"measured ones on both sides (GPU time per token unchanged, so rule 7 passes), and the "
        f"head's coverage is raised by {rp.COVERAGE_NUDGE_PP} pp by moving that share of GPU "
        f"time from its largest non-cuTile kernel to its largest cuTile kernel (total unchanged, "
        f"non-cuTile time down, so rule 8 passes). Without that nudge the same code twice is a "
        f"rule-8 `discard` on every trial by design (no coverage gain is never kept); see the "
        f"notes.",
        "",
        *_table(rows, args),
        *(_sequential_section(rows, args) if args.sequential else []),
        *(_mix_section(rows, args, ratios) if ratios else []),
        "",
        f"Reruns: the share of trials whose first round was `inconclusive` and went through the "
        f"rerun. {_target_cv_sentence()}",
        "",
        "Notes per file:",
        "",
    ]
    seen: set[Path] = set()
    for r in rows:
        if r.path not in seen:
            seen.add(r.path)
            lines += _file_notes(r.path, r.prepared, r.slow.runs)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.mix and not args.sequential:
        print("error: --mix needs --sequential", file=sys.stderr)
        return 2
    ratios = None
    if args.mix:
        try:
            ratios = _load_ratios(args.mix)
        except rp.ReplayError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    prepared: list[tuple[Path, rp.Prepared]] = []
    for path in args.files:
        try:
            prepared.append((path, _load(path)))
        except rp.ReplayError as exc:
            print(f"error: {path}: {exc}", file=sys.stderr)
            return 2
    rows = []
    for path, p in prepared:
        for margin in args.margins:
            print(f"replay: {path} (margin {margin:g})", file=sys.stderr)
            kw = {"trials": args.trials, "seed": args.seed, "margin": margin, "runs": args.runs}
            slow = rp.replay(p, args.slowdown, **kw)
            neutral = rp.replay(p, args.neutral, **kw)
            seq: dict = {}
            if args.sequential:
                if args.budget is not None:
                    kw["budget_s"] = args.budget
                try:
                    seq = {
                        "seq_slow": rp.replay_sequential(p, args.slowdown, **kw),
                        "seq_neutral": rp.replay_sequential(p, args.neutral, **kw),
                    }
                    if ratios:
                        kw["trials"] = args.mix_trials
                        seq["mix"] = replay_mix.replay_mix(p, ratios, **kw)
                except rp.ReplayError as exc:
                    print(f"error: {path}: {exc}", file=sys.stderr)
                    return 2
            rows.append(_Row(path, p, margin, slow, neutral, **seq))
    sys.stdout.write(report(rows, args, argv, ratios))
    return 1 if args.check and any(r.failures for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
