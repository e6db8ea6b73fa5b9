"""Run-to-run noise of static-mode ``generate()``: which runs are slow, and why.

Issue 22's target is a run CV of at most 2% per side; on some H200 hosts the runs were bimodal
(PyTorch static alternating between about 248 and 205 tok/s, its eager prefill between 29 and
54 ms) while the GPU time of the same runs varied by 0.3%. A suspect: transformers 5 gives every
``generate()`` a fresh static cache, at addresses the decode step's CUDA graphs were not
recorded for, so some runs record graphs again. For each cache policy asked for (``fresh``: one
per call, as ``generate()`` makes it; ``kept``: one per side, reset, the benchmark's default),
this times each side's runs alone, then N rounds interleaved as the benchmark runs them, with
the benchmark's own timed round (``throughput.measure``: a 1-token generate for the time to
first token, then the full one, the GC paused), and prints per block the throughput median and
CV, the lag-1 autocorrelation of the runs (near -1: alternation; near +1: drift), the time to
first token and the CUDA graphs recorded inside the timed runs. The per-run rows follow.

    python benchmarks/e2e/static_run_noise.py --model-key qwen3 --runs 12 --cache fresh kept
    python benchmarks/e2e/static_run_noise.py --model-key tiny-qwen3 --device cpu --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from contextlib import contextmanager

import torch
from tilegym_hf_bench.compile_guard import graph_recordings
from tilegym_hf_bench.generation import Generator
from tilegym_hf_bench.stats import lag1_autocorrelation
from tilegym_hf_bench.throughput import SideSamples, measure

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sides import static_sides  # noqa: E402

POLICIES = {"fresh": False, "kept": True}  # --cache choice -> Generator(keep_cache=...)


def recording_guard(counts: dict[str, list[int]], started: dict[str, list[float]]):
    """A ``measure`` guard that lets a timed run record CUDA graphs and counts them per side
    (the benchmark's own guard stops the run instead), noting when each run started."""

    @contextmanager
    def guard(label: str):
        side = label.rsplit(", ", 1)[-1]
        started.setdefault(side, []).append(time.time())
        with graph_recordings() as recorded:
            yield
        counts.setdefault(side, []).append(len(recorded))

    return guard


def timed_block(wl, runs: int, chosen: dict, label: str) -> list[tuple]:
    """(label, side, samples, recordings per run, start time per run) per side of one block."""
    counts: dict[str, list[int]] = {}
    started: dict[str, list[float]] = {}
    out = measure(
        chosen,
        wl.batch_size,
        wl.output_length,
        runs,
        lambda _: None,
        guard=recording_guard(counts, started),
    )
    return [(label, n, s, counts[n], started[n]) for n, s in out.items()]


def block_row(label: str, side: str, s: SideSamples, recorded: list[int]) -> str:
    tps, ttft = s.tokens_per_s, s.ttft_ms
    lag = lag1_autocorrelation(tps)
    return (
        f"| {label} | {side} | {statistics.median(tps):.2f} "
        f"| {100 * statistics.pstdev(tps) / statistics.fmean(tps):.2f}% "
        f"| {'n/a' if lag is None else f'{lag:+.2f}'} "
        f"| {statistics.median(ttft):.1f} ({min(ttft):.1f}-{max(ttft):.1f}) | {sum(recorded)} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-key", default="qwen3")
    parser.add_argument("--workload", default="default")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", nargs="+", choices=sorted(POLICIES), default=["kept"])
    args = parser.parse_args(argv)
    if args.runs < 3:
        parser.error("--runs must be at least 3")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU (pass --device cpu with a tiny preset)", file=sys.stderr)
        return 2
    wl, built, _ = static_sides(args.model_key, args.workload, args.seed, args.device)
    blocks = []
    for policy in args.cache:
        sides = {
            name: Generator(g.model, g.input_ids, args.device, g.mode, POLICIES[policy])
            for name, g in built.items()
        }
        for gen in sides.values():
            for _ in range(wl.warmup_runs):
                gen.generate(wl.output_length)
            gen.generate(1)
        for name, gen in sides.items():
            blocks += timed_block(wl, args.runs, {name: gen}, f"{policy} alone")
        blocks += timed_block(wl, args.runs, sides, f"{policy} interleaved")
    print(f"# {args.model_key} {args.workload} on {args.device}, {args.runs} runs a block")
    print("| cache, block | side | tok/s median | CV | lag-1 autocorr. | TTFT ms median (min-max) "
          "| graphs recorded |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for label, side, s, recorded, _ in blocks:
        print(block_row(label, side, s, recorded))
    print("\n| cache, block | side | run | started (UTC) | tok/s | TTFT ms | graphs recorded |")
    print("|---|---|---|---|---|---|---|")
    for label, side, s, recorded, started in blocks:
        rows = zip(started, s.tokens_per_s, s.ttft_ms, recorded, strict=True)
        for i, (t, tps, ttft, n) in enumerate(rows):
            clock = time.strftime("%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}"
            print(f"| {label} | {side} | {i + 1} | {clock} | {tps:.2f} | {ttft:.1f} | {n} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
