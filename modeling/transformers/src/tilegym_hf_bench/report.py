"""Text the auto-kernelize loop reads. Pure formatting.

The three grep lines (DESIGN.md) come last and in this order: baseline throughput, cuTile
throughput, coverage, in every ``--mode``; the details before them say which mode it was. A
part that was not measured keeps its line's place but says ``not measured (reason)`` instead of
a number.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from tilegym_hf_bench.modes import mode_line, mode_of
from tilegym_hf_bench.profiling.attribution import Coverage

SIDES = (("baseline", "PyTorch baseline"), ("cutile", "cuTile"))


def throughput_line(block: dict | None, reason: str | None) -> str:
    if block is None:
        return f"Average throughput: not measured ({reason or 'skipped'})"
    t = block["throughput"]
    std = t["std"] if t["std"] is not None else 0.0
    return f"Average throughput: {t['mean']:.2f} ± {std:.2f} tokens/sec"


def coverage_line(block: dict | None, reason: str | None) -> str:
    if block is None:
        return f">>> cuTile Kernel Coverage (GPU Time): not measured ({reason or 'skipped'}) <<<"
    return f">>> cuTile Kernel Coverage (GPU Time):    {block['gpu_time_pct']:.2f}% <<<"


def detail_lines(doc: dict[str, Any], not_measured: dict[str, str]) -> list[str]:
    """Everything else worth a glance: mode, CI, TTFT, decode rate, warm-up cost, correctness,
    speedup."""
    lines = [f"weights: {doc['weights']}" + (f" ({doc['model_id']})" if doc["model_id"] else "")]
    lines.append(mode_line(mode_of(doc["workload"])))
    for key, label in SIDES:
        block = doc[key]
        if block is None:
            lines.append(f"{label}: not measured ({not_measured.get(key, 'skipped')})")
            continue
        t = block["throughput"]
        ci = t["ci95"]
        ci_text = f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "n/a (one run)"
        ttft = statistics.median(block["ttft_ms"]["samples"] or [math.nan])
        dec = block["decode_tokens_per_s"]["mean"]
        lines.append(
            f"{label}: {t['mean']:.2f} tok/s, 95% CI {ci_text}, n={len(t['samples'])}; "
            f"TTFT median {ttft:.1f} ms (1-token generate); "
            + (f"decode {dec:.2f} tok/s" if dec is not None else "decode n/a")
            + f"; {compile_text(block.get('compile_s'))}"
        )
    base, cut = doc["baseline"], doc["cutile"]
    if base and cut:
        pairs = list(zip(cut["throughput"]["samples"], base["throughput"]["samples"], strict=True))
        ratios = [c / b for c, b in pairs if b > 0]
        if ratios:
            lines.append(
                f"cuTile / baseline: {sum(ratios) / len(ratios):.3f}x (mean of paired runs)"
            )
    c = doc["correctness"]
    if c is None:
        lines.append(f"correctness: not measured ({not_measured.get('correctness', 'skipped')})")
    else:
        lines.append(
            f"correctness: {'passed' if c['passed'] else 'FAILED'} "
            f"(cuTile rel err {_num(c['logits_rel_err'])}, baseline rel err "
            f"{_num(c['baseline_rel_err'])}, tolerance {_num(c['tolerance'])}, "
            f"top-1 agreement {_num(c['top1_agreement'])})"
        )
    return lines


def summary_lines(doc: dict[str, Any], not_measured: dict[str, str]) -> list[str]:
    return [
        throughput_line(doc["baseline"], not_measured.get("baseline")),
        throughput_line(doc["cutile"], not_measured.get("cutile")),
        coverage_line(doc["coverage"], not_measured.get("coverage")),
    ]


def compile_text(seconds: float | None) -> str:
    """The warm-up's one-time cost, said apart from the timed numbers it is not part of."""
    if seconds is None:
        return "compile/capture n/a (fewer than two warm-up runs)"
    return f"compile/capture {seconds:.2f} s (warm-up, not timed)"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3e}" if abs(x) < 0.01 else f"{x:.4f}"


def coverage_table_lines(cov: Coverage, top: int = 12) -> list[str]:
    """The largest non-cuTile kernels with the module that launched them, then the largest
    cuTile ones: where the next experiment should look."""
    total = cov.total_ns or 1
    lines = [
        f"GPU kernel time {cov.total_ns / 1e6:.2f} ms in {cov.launches} launches; cuTile "
        f"{100 * cov.cutile_ns / total:.2f}% of time, {cov.launch_pct:.2f}% of launches"
    ]
    for title, want in (("largest non-cuTile kernels", False), ("largest cuTile kernels", True)):
        rows = [r for r in cov.rows if r.cutile == want][:top]
        lines.append(f"{title}:")
        if not rows:
            lines.append("  (none)")
        for r in rows:
            name = r.name if len(r.name) <= 70 else r.name[:67] + "..."
            lines.append(
                f"  {100 * r.gpu_ns / total:6.2f}%  {r.gpu_ns / 1e6:9.3f} ms  {r.calls:7d}x  "
                f"{r.module or '(outside any module)'}  {name}"
            )
    return lines
