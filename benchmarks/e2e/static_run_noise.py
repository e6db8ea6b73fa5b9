"""Run-to-run noise of static-mode ``generate()``: which runs are slow.

Issue 22's target is a run CV of at most 2% per side; on some H200 hosts the runs were bimodal
(PyTorch static alternating between about 248 and 205 tok/s, its eager prefill between 29 and
54 ms) while the GPU time of the same runs varied by 0.3%. This times each side's runs alone
(no other side between them), then N rounds interleaved as the benchmark runs them, all with
the benchmark's own timed round (``throughput.measure``: a 1-token generate for the time to
first token, then the full one, the GC paused, a recompile an error), and prints per block the
throughput median and CV, the lag-1 autocorrelation of the runs (near -1: alternation; near
+1: drift) and the time to first token. The per-run rows follow.

    python benchmarks/e2e/static_run_noise.py --model-key qwen3 --runs 12
    python benchmarks/e2e/static_run_noise.py --model-key tiny-qwen3 --device cpu --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
from tilegym_hf_bench.stats import lag1_autocorrelation
from tilegym_hf_bench.throughput import SideSamples, measure

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sides import static_sides  # noqa: E402


def block_row(label: str, side: str, s: SideSamples) -> str:
    tps, ttft = s.tokens_per_s, s.ttft_ms
    lag = lag1_autocorrelation(tps)
    return (
        f"| {label} | {side} | {statistics.median(tps):.2f} "
        f"| {100 * statistics.pstdev(tps) / statistics.fmean(tps):.2f}% "
        f"| {'n/a' if lag is None else f'{lag:+.2f}'} "
        f"| {statistics.median(ttft):.1f} ({min(ttft):.1f}-{max(ttft):.1f}) |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-key", default="qwen3")
    parser.add_argument("--workload", default="default")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.runs < 3:
        parser.error("--runs must be at least 3")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU (pass --device cpu with a tiny preset)", file=sys.stderr)
        return 2
    wl, sides, _ = static_sides(args.model_key, args.workload, args.seed, args.device)
    for gen in sides.values():
        for _ in range(wl.warmup_runs):
            gen.generate(wl.output_length)

    def timed(chosen):
        return measure(chosen, wl.batch_size, wl.output_length, args.runs, lambda _: None)

    blocks = [("alone", name, timed({name: gen})[name]) for name, gen in sides.items()]
    blocks += [("interleaved", name, s) for name, s in timed(sides).items()]
    print(f"# {args.model_key} {args.workload} on {args.device}, {args.runs} runs a block")
    print("| block | side | tok/s median | CV | lag-1 autocorr. | TTFT ms median (min-max) |")
    print("|---|---|---|---|---|---|")
    for label, side, s in blocks:
        print(block_row(label, side, s))
    print("\n| block | side | run | tok/s | TTFT ms |")
    print("|---|---|---|---|---|")
    for label, side, s in blocks:
        for i, (tps, ttft) in enumerate(zip(s.tokens_per_s, s.ttft_ms, strict=True)):
            print(f"| {label} | {side} | {i + 1} | {tps:.2f} | {ttft:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
