"""Host time of one decode step's mask, transformers' SDPA builder beside tilegym's.

In static mode transformers builds every decode step's mask eagerly, outside the compiled
step, from a fresh mask function, so the builder's host time adds to every token. Per window
(0: plain causal) this times the two builders on the arguments of a static cache's decode step
(one query at ``--position`` of ``--kv-length`` slots, an all-ones 2D mask), each call with a
new mask function as ``generate()`` makes it, after warm-up calls, and prints the median and
the spread of ``--repeats`` blocks of ``--calls`` calls. Runs on a CPU.

    python benchmarks/e2e/mask_host_cost.py --windows 0 512 4096 262144
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from transformers.masking_utils import (
    causal_mask_function,
    sdpa_mask,
    sliding_window_causal_mask_function,
)

from tilegym.transformers.attention import tilegym_mask


def step_args(window: int, kv_length: int, position: int, device: str) -> dict:
    """Keyword arguments of a static cache's decode-step mask, with a fresh mask function."""
    return dict(
        batch_size=1,
        q_length=1,
        kv_length=kv_length,
        q_offset=position,
        kv_offset=0,
        mask_function=sliding_window_causal_mask_function(window)
        if window
        else causal_mask_function,
        attention_mask=torch.ones(1, position + 1, dtype=torch.long, device=device),
        local_size=window or None,
        allow_is_causal_skip=False,
        device=device,
    )


def per_call_us(builder, window: int, args: argparse.Namespace) -> list[float]:
    """µs per call of ``builder``, one value per block."""
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    for _ in range(args.warmup):
        builder(**step_args(window, args.kv_length, args.position, args.device))
    blocks = []
    for _ in range(args.repeats):
        calls = [
            step_args(window, args.kv_length, args.position, args.device) for _ in range(args.calls)
        ]
        sync()
        start = time.perf_counter()
        for kwargs in calls:
            builder(**kwargs)
        sync()
        blocks.append(1e6 * (time.perf_counter() - start) / args.calls)
    return blocks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--windows", type=int, nargs="+", default=[0, 512, 4096, 262144])
    parser.add_argument("--kv-length", type=int, default=2176)
    parser.add_argument("--position", type=int, default=2100)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if min(args.windows) < 0 or args.calls < 1 or args.repeats < 1 or args.warmup < 1:
        parser.error("--windows must be at least 0; --calls, --repeats, --warmup at least 1")
    if not 0 <= args.position < args.kv_length:
        parser.error("--position must lie in [0, --kv-length)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"# decode-step mask, {args.kv_length} slots, position {args.position}, "
          f"{args.device}, torch {torch.__version__}; µs per call, median [min, max] of "
          f"{args.repeats} blocks of {args.calls}")  # fmt: skip
    print("| window | transformers sdpa_mask | tilegym_mask |")
    print("|---|---|---|")
    for window in args.windows:
        cells = []
        for builder in (sdpa_mask, tilegym_mask):
            us = per_call_us(builder, window, args)
            cells.append(f"{statistics.median(us):.1f} [{min(us):.1f}, {max(us):.1f}]")
        print(f"| {window or 'causal'} | {cells[0]} | {cells[1]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
