"""Is the eager prefill host-bound? Host issue time against wall time, PyTorch beside cuTile.

``generate()`` runs the prompt's forward eagerly in static mode too (only the decode step is
compiled). A side whose Python issues kernels slower than the GPU runs them waits on the host:
its time to first token then follows the host's speed, which on the H200 hosts here changes by
up to 2x within a minute (``docs/results/h200-2026-12-02-host-noise``). Per side and run this
times one prefill forward into a static cache: ``issue`` (until the forward returns, before any
sync), ``wall`` (after the sync) and ``gpu`` (CUDA events around it). ``issue`` close to
``wall`` means the host sets the pace. Sides alternate run by run. ``--python-top N`` adds the
N Python functions with the most self time in one more prefill a side, under cProfile.

    python benchmarks/e2e/prefill_host_time.py --model-key phi3 --runs 20 --python-top 20
    python benchmarks/e2e/prefill_host_time.py --model-key tiny-phi3 --device cpu --runs 2
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

import torch
from tilegym_hf_bench.generation import cache_kwarg
from tilegym_hf_bench.presets import PRESETS
from transformers import StaticCache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sides import static_sides  # noqa: E402
from static_host_profile import python_top  # noqa: E402


class Prefill:
    """One side's prompt forward into its own static cache, reset before each call."""

    def __init__(self, model, input_ids, device: str):
        self.model = model
        self.input_ids = input_ids
        self.cuda = device.startswith("cuda")
        self.cache_kwarg = cache_kwarg(model)
        self.cache = StaticCache(
            config=model.config.get_text_config(decoder=True),
            max_cache_len=input_ids.shape[1] + 1,
        )

    def __call__(self) -> None:
        with torch.inference_mode():
            self.cache.reset()
            kwargs = {self.cache_kwarg: self.cache}
            self.model(input_ids=self.input_ids, logits_to_keep=1, **kwargs)

    def timed(self) -> tuple[float, float, float]:
        """(issue ms, wall ms, GPU-span ms; 0 without CUDA) of one call."""
        sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        sync()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        self()
        t1 = time.perf_counter()
        if self.cuda:
            end.record()
        sync()
        t2 = time.perf_counter()
        gpu = start.elapsed_time(end) if self.cuda else 0.0
        return 1e3 * (t1 - t0), 1e3 * (t2 - t0), gpu


def summary(values: list[float]) -> str:
    """median [min, max]"""
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-key", default="phi3")
    parser.add_argument("--workload", default="default")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--python-top", type=int, default=0, metavar="N")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.warmup < 0 or args.python_top < 0:
        parser.error("--runs must be at least 1, --warmup and --python-top at least 0")
    if args.model_key not in PRESETS:
        parser.error(f"--model-key {args.model_key!r} is not a preset ({', '.join(PRESETS)})")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda needs a CUDA GPU", file=sys.stderr)
        return 2
    wl, gens, _ = static_sides(args.model_key, args.workload, args.seed, args.device)
    sides = {name: Prefill(g.model, g.input_ids, args.device) for name, g in gens.items()}
    for _ in range(args.warmup):
        for side in sides.values():
            side.timed()
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in sides}
    for _ in range(args.runs):
        for name, side in sides.items():
            rows[name].append(side.timed())
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    print(f"# {args.model_key}, prefill of {wl.batch_size}x{wl.input_length} tokens, eager, "
          f"{args.runs} runs a side alternating; {where}, torch {torch.__version__}")  # fmt: skip
    print("| side | issue ms | wall ms | GPU span ms | issue / wall (median) |")
    print("|---|---|---|---|---|")
    for name, samples in rows.items():
        issue, wall, gpu = (list(col) for col in zip(*samples, strict=True))
        share = statistics.median(i / w for i, w in zip(issue, wall, strict=True))
        print(f"| {name} | {summary(issue)} | {summary(wall)} | {summary(gpu)} | {share:.2f} |")
    print("\n| run | " + " | ".join(f"{n} issue / wall ms" for n in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for i in range(args.runs):
        cells = " | ".join(f"{rows[n][i][0]:.1f} / {rows[n][i][1]:.1f}" for n in rows)
        print(f"| {i + 1} | {cells} |")
    if args.python_top:
        print("\n| side | Python function (cProfile, one prefill) | calls | self µs |")
        print("|---|---|---|---|")
        for name, side in sides.items():
            profiler = cProfile.Profile()
            profiler.enable()
            side()
            if side.cuda:
                torch.cuda.synchronize()
            profiler.disable()
            for fn, calls, us in python_top(pstats.Stats(profiler).stats, 1, args.python_top):
                print(f"| {name} | `{fn}` | {calls:.0f} | {us:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
