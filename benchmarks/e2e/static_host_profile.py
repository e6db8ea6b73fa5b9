"""Where a static-mode ``generate()`` spends host time, PyTorch static beside cuTile static.

A compiled decode step can be slow with fast kernels: a graph break upstream runs parts of each
step eagerly, a host read of device data syncs, a host int reaching the graph records a CUDA
graph per value, and ``generate()`` itself syncs every token, so host time per token adds to
GPU time. Per side this prints, for one warm ``generate()`` under the profiler: the device
syncs, CUDA graph launches and recordings, Dynamo guard checks and eager kernel launches per
generated token, their host time, the GPU time per token, and the compiled frames and graph
breaks of the warm-up. Both sides are the same random-weight preset (the cuTile side a twin
sharing the baseline's weights), as ``static_generate.py`` builds them.

``--python-top N`` adds, per side, the N Python functions with the most self time in one more
warm ``generate()`` under cProfile (µs per token; cProfile slows Python down, so read the
shares, not the sums): where the host time that neither the kernels nor the launches explain
goes.

    python benchmarks/e2e/static_host_profile.py --models phi3 --workload default
    python benchmarks/e2e/static_host_profile.py --models qwen3 --python-top 25
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

import torch
from tilegym_hf_bench.generation import Generator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sides import static_sides  # noqa: E402

#: profiler event name -> the column it counts
HOST_EVENTS = {
    "cudaStreamSynchronize": "syncs",
    "cudaDeviceSynchronize": "syncs",
    "cudaGraphLaunch": "graph launches",
    "TorchDynamo Cache Lookup": "guard checks",
    "cudaLaunchKernel": "eager launches",
    "cuLaunchKernel": "eager launches",
    "cuLaunchKernelEx": "eager launches",
}
RECORD_PREFIX = "CUDAGraphNode.record"


def host_table(events, tokens: int) -> dict[str, tuple[float, float]]:
    """``{column: (calls per token, host ms per token)}`` from profiler ``key_averages()``."""
    out: dict[str, list[float]] = {}
    for e in events:
        column = HOST_EVENTS.get(e.key)
        if column is None and e.key.startswith(RECORD_PREFIX):
            column = "graph recordings"
        if column is None:
            continue
        calls, ms = out.setdefault(column, [0.0, 0.0])
        out[column] = [calls + e.count, ms + e.self_cpu_time_total / 1e3]
    return {k: (c / tokens, ms / tokens) for k, (c, ms) in out.items()}


def profile_side(gen: Generator, tokens: int) -> tuple[dict, float, float]:
    """(host table, GPU ms per token, wall ms per token) of one warm profiled generate()."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        gen.generate(tokens)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    gpu_us = sum(
        e.device_time for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
    )
    return host_table(prof.key_averages(), tokens), gpu_us / 1e3 / tokens, wall * 1e3 / tokens


def python_top(stats: dict, tokens: int, n: int) -> list[tuple[str, float, float]]:
    """(function, calls per token, self µs per token) of the ``n`` functions with the most self
    time, from ``pstats.Stats.stats`` ({(file, line, name): (prim calls, calls, self s, cum s,
    callers)})."""
    rows = []
    for (path, line, name), (_, calls, self_s, _, _) in stats.items():
        where = f"{os.path.basename(path)}:{line}({name})" if line else name
        rows.append((where, calls / tokens, 1e6 * self_s / tokens))
    rows.sort(key=lambda r: -r[2])
    return rows[:n]


def profile_python(gen: Generator, tokens: int, n: int) -> list[tuple[str, float, float]]:
    """``python_top`` of one warm generate() under cProfile."""
    profiler = cProfile.Profile()
    profiler.enable()
    gen.generate(tokens)
    gen.sync()
    profiler.disable()
    return python_top(pstats.Stats(profiler).stats, tokens, n)


def warm_up(gen: Generator, tokens: int, runs: int) -> tuple[float, dict]:
    """Seconds of the warm-up generate()s and Dynamo's frame and graph-break counts."""
    counters = torch._dynamo.utils.counters
    counters.clear()
    start = time.perf_counter()
    for _ in range(runs):
        gen.generate(tokens)
    torch.cuda.synchronize()
    frames = dict(counters["frames"])
    return time.perf_counter() - start, {
        "frames": frames.get("total", 0),
        "graph breaks": sum(counters["graph_break"].values()),
    }


def measure(model_key: str, workload: str, seed: int, python_n: int = 0) -> list[dict]:
    wl, sides, _ = static_sides(model_key, workload, seed)
    rows = []
    for side, gen in sides.items():
        warm_s, compiled = warm_up(gen, wl.output_length, wl.warmup_runs)
        table, gpu_ms, wall_ms = profile_side(gen, wl.output_length)
        top = profile_python(gen, wl.output_length, python_n) if python_n else []
        rows.append(
            dict(side=side, warm_s=warm_s, gpu_ms=gpu_ms, wall_ms=wall_ms, host=table, top=top)
            | compiled
        )
        torch._dynamo.reset()
    return rows


COLUMNS = ("syncs", "graph launches", "graph recordings", "guard checks", "eager launches")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["phi3"])
    parser.add_argument("--workload", default="default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--python-top", type=int, default=0, metavar="N")
    args = parser.parse_args(argv)
    if args.python_top < 0:
        parser.error("--python-top must be at least 0")
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}; per generated token:")
    print("# calls / host ms of each event, GPU and wall ms, from one profiled warm generate()")
    head = " | ".join(f"{c} (n / ms)" for c in COLUMNS)
    print(f"| model | side | frames | graph breaks | {head} | GPU ms | wall ms | warm-up s |")
    print("|---|---|---|---|" + "---|" * len(COLUMNS) + "---|---|---|")
    tops = []
    for model_key in args.models:
        for r in measure(model_key, args.workload, args.seed, args.python_top):
            tops += [(model_key, r["side"], *row) for row in r["top"]]
            cells = " | ".join(
                "{:.2f} / {:.3f}".format(*r["host"].get(c, (0.0, 0.0))) for c in COLUMNS
            )
            print(
                f"| {model_key} | {r['side']} | {r['frames']} | {r['graph breaks']} | {cells} "
                f"| {r['gpu_ms']:.3f} | {r['wall_ms']:.3f} | {r['warm_s']:.1f} |",
                flush=True,
            )
        torch.cuda.empty_cache()
    if tops:
        print("\n| model | side | Python function (cProfile, one warm generate()) | calls / token "
              "| self µs / token |")  # fmt: skip
        print("|---|---|---|---|---|")
        for model_key, side, where, calls, us in tops:
            print(f"| {model_key} | {side} | `{where}` | {calls:.2f} | {us:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
