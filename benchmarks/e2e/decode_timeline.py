"""Where a static-mode ``generate()`` waits: GPU busy, GPU idle inside the step, GPU idle between
steps, per generated token, for PyTorch and for cuTile patch variants side by side.

A change that takes GPU time away can still make tokens slower: the kernels it adds may leave
the GPU idle between them inside the captured decode step (a launch that waits for the SMs to
drain, a dependent launch, a kernel that cannot start before the previous one ends), which the
kernel-time total cannot see. From one profiled warm ``generate()`` a variant, this sorts every
GPU activity by start time and splits the idle time between consecutive activities into gaps
shorter than ``--gap-us`` (inside a graph replay: the GPU's own) and longer ones (the host's
turn between steps, where ``generate()`` runs Python), then names the activities that most often
start after an inner gap. A variant is ``pytorch``, ``cutile`` (the model's flags) or
``cutile:FLAG=VALUE,...`` (those flags changed).

    python benchmarks/e2e/decode_timeline.py --model-key phi3 --variants pytorch cutile \\
        cutile:attn=False
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass
class Timeline:
    """Per-token GPU busy time and idle gaps (ms), and the activities after inner gaps."""

    busy_ms: float
    inner_gap_ms: float
    outer_gap_ms: float
    after_inner_gap: dict[str, tuple[float, float]] = field(default_factory=dict)


def timeline(activities: list[tuple[str, float, float]], tokens: int, gap_us: float) -> Timeline:
    """Split ``(name, start µs, duration µs)`` GPU activities into busy time and idle gaps.

    Overlapping activities count once (busy time is the union of their intervals); a gap is
    the idle time between the end of everything before an activity and its start."""
    busy = inner = outer = 0.0
    after: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    end = None
    for name, start, dur in sorted(activities, key=lambda a: a[1]):
        stop = start + dur
        if end is None:
            busy += dur
            end = stop
            continue
        if start > end:
            gap = start - end
            if gap < gap_us:
                inner += gap
                after[name][0] += 1
                after[name][1] += gap
            else:
                outer += gap
            busy += dur
        elif stop > end:
            busy += stop - end
        end = max(end, stop)
    per = 1e3 * tokens
    return Timeline(
        busy / per,
        inner / per,
        outer / per,
        {k: (n / tokens, ms / per) for k, (n, ms) in after.items()},
    )


def parse_variant(text: str) -> tuple[str, dict[str, bool]]:
    """``pytorch`` | ``cutile`` | ``cutile:FLAG=VALUE,...`` -> (side, flag overrides)."""
    side, _, rest = text.partition(":")
    if side not in ("pytorch", "cutile") or (side == "pytorch" and rest):
        raise ValueError(f"variant {text!r}: expected pytorch, cutile or cutile:FLAG=VALUE,...")
    flags = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or value not in ("True", "False"):
            raise ValueError(f"variant {text!r}: {item!r} is not FLAG=True or FLAG=False")
        flags[key] = value == "True"
    return side, flags


def trace_activities(path: str) -> list[tuple[str, float, float]]:
    """The GPU activities of a Chrome trace the profiler exported."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    return [
        (e["name"], float(e["ts"]), float(e.get("dur", 0.0)))
        for e in events
        if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES
    ]


def profile_timeline(gen, tokens: int, gap_us: float) -> Timeline:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        gen.generate(tokens)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        return timeline(trace_activities(path), tokens, gap_us)


def run_variant(wl, base, ids, variant, args):
    """(median wall ms per token of ``--runs`` warm generate()s, the profiled timeline)."""
    import torch
    from tilegym_hf_bench.generation import Generator
    from tilegym_hf_bench.model_factory import twin_sharing_weights
    from tilegym_hf_bench.modes import STATIC
    from tilegym_hf_bench.tilegym_patch import apply_patch, patch_flags

    side, overrides = variant
    model = base
    if side == "cutile":
        model = twin_sharing_weights(base)
        model_type = base.config.model_type
        flags = patch_flags(model_type) | overrides
        apply_patch(model, model_type, {model_type: flags})
    gen = Generator(model, ids, "cuda", STATIC)
    tokens = wl.output_length
    for _ in range(wl.warmup_runs):
        gen.generate(tokens)
    walls = []
    for _ in range(args.runs):
        seconds, _ = gen.timed(tokens)
        walls.append(1e3 * seconds / tokens)
    tl = profile_timeline(gen, tokens, args.gap_us)
    torch._dynamo.reset()
    return statistics.median(walls), tl


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-key", default="phi3")
    parser.add_argument("--workload", default="default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", nargs="+", default=["pytorch", "cutile"])
    parser.add_argument("--runs", type=int, default=5, help="timed generate()s a variant")
    parser.add_argument("--gap-us", type=float, default=50.0)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args(argv)
    try:
        variants = [parse_variant(v) for v in args.variants]
    except ValueError as exc:
        parser.error(str(exc))
    if args.runs < 1 or args.gap_us <= 0 or args.top < 0:
        parser.error("--runs must be at least 1, --gap-us above 0, --top at least 0")
    from tilegym_hf_bench.presets import PRESETS
    from tilegym_hf_bench.tilegym_patch import PatchUnavailable, patch_flags

    if args.model_key not in PRESETS:
        parser.error(f"--model-key {args.model_key!r} is not a preset ({', '.join(PRESETS)})")
    try:
        known = patch_flags(PRESETS[args.model_key].model_type)
    except PatchUnavailable as exc:
        parser.error(str(exc))
    for text, (_, overrides) in zip(args.variants, variants, strict=True):
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            parser.error(f"variant {text!r}: no patch flag {unknown[0]!r} ({', '.join(known)})")
    import torch

    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    from tilegym_hf_bench.generation import make_input_ids
    from tilegym_hf_bench.model_factory import random_model
    from tilegym_hf_bench.modes import STATIC
    from tilegym_hf_bench.workloads import resolve_workload

    wl = resolve_workload(args.workload, mode=STATIC)
    base = random_model(args.model_key, "cuda", args.seed).model
    ids = make_input_ids(base.config.vocab_size, wl.batch_size, wl.input_length, args.seed, "cuda")
    print(f"# {args.model_key} static, {wl.batch_size}x{wl.input_length} -> {wl.output_length}; "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}; ms per generated token; "
          f"inner gaps < {args.gap_us:g} µs")  # fmt: skip
    print(
        "| variant | wall (median) | profiled: GPU busy | idle inside steps | idle between steps |"
    )
    print("|---|---|---|---|---|")
    tops = []
    for text, variant in zip(args.variants, variants, strict=True):
        start = time.perf_counter()
        wall, tl = run_variant(wl, base, ids, variant, args)
        print(
            f"| {text} | {wall:.3f} | {tl.busy_ms:.3f} | {tl.inner_gap_ms:.3f} "
            f"| {tl.outer_gap_ms:.3f} |",
            flush=True,
        )
        ranked = sorted(tl.after_inner_gap.items(), key=lambda kv: -kv[1][1])[: args.top]
        tops += [(text, name, n, ms) for name, (n, ms) in ranked]
        print(f"#   {text}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    if tops:
        print("\n| variant | activity after an inner gap | gaps / token | idle ms / token |")
        print("|---|---|---|---|")
        for text, name, n, ms in tops:
            print(f"| {text} | `{name[:90]}` | {n:.2f} | {ms:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
