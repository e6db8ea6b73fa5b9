"""PyTorch static vs cuTile static: ``generate(cache_implementation="static")`` side by side.

Both sides are the same random-weight preset (the cuTile side a twin sharing the baseline's
weights, patched), run with transformers' default compile config for the decode step (inductor,
reduce-overhead: CUDA graphs); prefill stays eager on both. Per model and workload it prints the
median throughput of interleaved timed runs with their spread, the compile + capture time of
the warm-up, the GPU time per generated token from one profiled generate() (every kernel,
memset and copy the profiler sees, graph replays included), and the GPU-busy share of the wall
time (that GPU time over the median wall time of one generate()). Timed runs fail on any
recompile.

Each ``--variant SETTING[,SETTING...]`` adds one more cuTile side, patched with those settings
over the model's ``MODEL_PATCH_KWARGS`` entry (``norm_gemv=1``, ``rope=False``), on the same
weights and interleaved with the others: a tuning's A/B in one process.

    python benchmarks/e2e/static_generate.py --models qwen3 llama --workloads default decode
    python benchmarks/e2e/static_generate.py --models qwen3 --workloads default \
        --variant norm_gemv=1 --variant norm_gemv=2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from tilegym_hf_bench.generation import Generator

from tilegym.transformers.monkey_patch import FLAGS, TUNING, check_tuning, parse_setting

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sides import CUTILE, PYTORCH, static_sides  # noqa: E402


def gpu_ms(gen: Generator, tokens: int) -> float:
    """Total device time (ms) of one generate() as the profiler records it."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        gen.generate(tokens)
        torch.cuda.synchronize()
    total_us = sum(
        e.device_time for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
    )
    return total_us / 1e3


def parse_variant(text: str) -> dict:
    """``norm_gemv=1,rope=False`` -> ``{"norm_gemv": 1, "rope": False}``; a one-line
    ``ValueError`` for a name that is no patch flag or tuning, or a value it does not take."""
    settings = dict(parse_setting(item) for item in text.split(","))
    unknown = sorted(set(settings) - set(FLAGS) - set(TUNING))
    if unknown:
        raise ValueError(f"{text}: unknown {unknown} (known: {', '.join((*FLAGS, *TUNING))})")
    check_tuning({k: v for k, v in settings.items() if k in TUNING})
    return settings


def measure(
    model_key: str, workload: str, runs: int, seed: int, variants: tuple[dict, ...] = ()
) -> list[dict]:
    wl, sides, report = static_sides(model_key, workload, seed, variants=variants)
    rows = {name: {"side": name, "wall": [], "applied": ""} for name in sides}
    rows[CUTILE]["applied"] = ",".join(report.applied)
    for name, gen in sides.items():
        start = time.perf_counter()
        for _ in range(wl.warmup_runs):
            gen.generate(wl.output_length)
        torch.cuda.synchronize()
        rows[name]["warmup_s"] = time.perf_counter() - start
    with torch.compiler.set_stance("fail_on_recompile"):
        for _ in range(runs):  # interleaved
            for name, gen in sides.items():
                rows[name]["wall"].append(gen.timed(wl.output_length)[0])
        for name, gen in sides.items():
            rows[name]["gpu_ms"] = gpu_ms(gen, wl.output_length)
    tokens = wl.batch_size * wl.output_length
    out = []
    for row in rows.values():
        tps = [tokens / w for w in row["wall"]]
        med_wall = statistics.median(row["wall"])
        row.update(
            model=model_key,
            workload=f"{wl.batch_size}x{wl.input_length}->{wl.output_length}",
            tps=statistics.median(tps),
            tps_min=min(tps),
            tps_max=max(tps),
            cv=statistics.pstdev(tps) / statistics.mean(tps),
            gpu_ms_per_token=row["gpu_ms"] / wl.output_length,
            busy=row["gpu_ms"] / 1e3 / med_wall,
        )
        out.append(row)
    for row in out:
        if row["side"] != PYTORCH:
            row["speedup"] = row["tps"] / rows[PYTORCH]["tps"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["qwen3", "llama"])
    parser.add_argument("--workloads", nargs="+", default=["default", "decode"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="SETTING[,SETTING...]",
        help="one more cuTile side with these patch settings (e.g. norm_gemv=1); repeatable",
    )
    args = parser.parse_args(argv)
    try:
        variants = tuple(parse_variant(v) for v in args.variant)
    except ValueError as exc:
        print(f"error: --variant {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    print(
        "| model | workload | side | tok/s median (min-max) | CV | vs PyTorch static "
        "| warm-up s | GPU ms/token | GPU busy |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for model_key in args.models:
        for workload in args.workloads:
            for r in measure(model_key, workload, args.runs, args.seed, variants):
                ratio = f"{r['speedup']:.2f}x" if "speedup" in r else ""
                print(
                    f"| {r['model']} | {r['workload']} | {r['side']} | {r['tps']:.1f} "
                    f"({r['tps_min']:.1f}-{r['tps_max']:.1f}) | {r['cv'] * 100:.1f}% | {ratio} "
                    f"| {r['warmup_s']:.1f} | {r['gpu_ms_per_token']:.3f} "
                    f"| {r['busy'] * 100:.0f}% |",
                    flush=True,
                )
            torch._dynamo.reset()
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
