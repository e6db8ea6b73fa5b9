"""Gate-up + SiLU-and-mul at prefill: the fused cuTile kernel's tiles against the unfused paths.

Inside generate() the fused kernel once ran llama's M = 2048 gate-up at 98% of the torch pair
(cuBLAS F.linear + silu*mul) while the plain cuTile GEMM of the same packed [2I, K] weight ran
at 97% of cuBLAS alone; loading the X tile once per K step for both mmas took it to 113%
(docs/results/h200-2026-12-01/ops/gemm_gate_up_prefill.txt). This table times, interleaved on
the same inputs: the torch pair, cuBLAS's GEMM alone, the cuTile GEMM of the packed weight
(table config and wider tiles), that GEMM followed by the cuTile SiLU-and-mul kernel (the
unfused cuTile path), and the fused kernel at several tiles. Every cuTile output is checked
against the fp32 result before it is timed.

Usage (GPU, repo root, src on PYTHONPATH):
  TILEGYM_BENCH_FLUSH=read python benchmarks/ops/bench_gate_up_prefill.py --models llama,qwen3
"""

from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import format_table, interleaved  # noqa: E402

#: hidden size, intermediate size
MODELS = {"qwen3": (1024, 3072), "llama": (2048, 8192)}
HEADER = ["model", "M", "variant", "us", "spread%", "TFLOP/s", "%pair"]


def variants(m: int, i: int, k: int) -> dict[str, tuple[str, object]]:
    """{name: (path, config)}: path is 'linear' (packed GEMM), 'unfused' (GEMM + SiLU-and-mul
    kernel) or 'fused'; config None means the tile table's choice."""
    from tilegym.ops.gemm_configs import TileConfig, choose_config, config_name

    out: dict[str, tuple[str, object]] = {}
    for cfg in (None, TileConfig(64, 256, 64), TileConfig(128, 256, 64)):
        name = config_name(cfg or choose_config(m, 2 * i, k))
        out[f"linear {name}"] = ("linear", cfg)
    out["unfused (table GEMM + silu_and_mul)"] = ("unfused", None)
    fused = [None, TileConfig(128, 64, 64, transpose_tile=False), TileConfig(128, 128, 64)]
    fused += [TileConfig(64, 64, 64), TileConfig(64, 128, 64, transpose_tile=False)]
    for cfg in fused:
        out[f"fused {config_name(cfg or choose_config(m, i, k, gated=True))}"] = ("fused", cfg)
    return out


def bench(model: str, m: int, iters: int, shard: tuple[int, int] | None) -> list[list]:
    import torch
    import torch.nn.functional as F

    from tilegym.ops import gemm
    from tilegym.ops.silu_and_mul import silu_and_mul

    k, i = MODELS[model]
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(2 * i, k, device="cuda", generator=gen) / math.sqrt(k)).to(torch.bfloat16)
    ref_gemm = F.linear(x.float(), w.float())
    g, u = ref_gemm.chunk(2, dim=-1)
    ref = F.silu(g) * u
    packed = torch.empty(m, 2 * i, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, i, device="cuda", dtype=torch.bfloat16)

    def pair():
        gate, up = F.linear(x, w).chunk(2, dim=-1)
        return F.silu(gate) * up

    def run(path, cfg):
        if path == "fused":
            return lambda: gemm.fused_gate_up_silu(x, w, out=out, config=cfg)
        if path == "linear":
            return lambda: gemm.linear(x, w, out=packed, config=cfg)
        return lambda: silu_and_mul(gemm.linear(x, w, out=packed, config=cfg))

    fns = {"torch pair (cuBLAS + silu*mul)": pair, "cuBLAS GEMM alone": lambda: F.linear(x, w)}
    items = list(variants(m, i, k).items())
    if shard:
        items = items[shard[0] :: shard[1]]
    for name, (path, cfg) in items:
        fn = run(path, cfg)
        got = fn().float()
        want = ref_gemm if path == "linear" else ref
        err = ((got - want).norm() / want.norm()).item()
        if not err < 2e-2:
            print(f"# {model} M={m} {name}: relative error {err:.2e}, not timed", flush=True)
            continue
        fns[name] = fn
    if shard:
        return []
    stats = interleaved(fns, warmup=5, iters=iters, flush_l2=True)
    flops = 2.0 * m * 2 * i * k
    base = stats["torch pair (cuBLAS + silu*mul)"].median_us
    return [
        [
            model,
            m,
            name,
            s.median_us,
            s.spread_pct,
            flops / s.median_us / 1e6,
            100 * base / s.median_us,
        ]
        for name, s in stats.items()
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="llama,qwen3")
    p.add_argument("--tokens", default="2048")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup-shard", default=None, metavar="I/N", help="compile only this share")
    a = p.parse_args(argv)
    models = [x for x in a.models.split(",") if x]
    if not models or set(models) - set(MODELS):
        print(f"error: --models {a.models!r}: choose from {', '.join(MODELS)}", file=sys.stderr)
        return 2
    try:
        tokens = [int(t) for t in a.tokens.split(",")]
        shard = tuple(int(v) for v in a.warmup_shard.split("/")) if a.warmup_shard else None
    except ValueError:
        tokens, shard = [], None
    if not tokens or min(tokens) < 1 or a.iters < 1 or (a.warmup_shard and len(shard) != 2):
        print("error: --tokens, --iters and --warmup-shard I/N must be positive", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA GPU", file=sys.stderr)
        return 1
    rows = []
    for model in models:
        for m in tokens:
            rows += bench(model, m, a.iters, shard)
    if rows:
        print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
        print(format_table(HEADER, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
