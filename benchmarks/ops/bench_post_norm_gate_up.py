"""A post-norm layer's decode MLP entry: ``add_rms_norm_gate_up`` (one launch) against
``rms_norm_add`` then the gate/up GEMM the tile table picks (two launches), at OLMo's shapes.

Each side runs as a model's decode step runs it: ``--layers`` calls back to back in one CUDA
graph, each on its own layer's weight (so the weights stream from HBM, not L2), graphs of the
sides replayed in turn; µs a call is the median over replays, with the min-max spread. The
fused kernel is timed at its shipped tile and at each ``--tile TN,TK[,OCC]``.

    python benchmarks/ops/bench_post_norm_gate_up.py                   # olmo3 and olmo2 shapes
    python benchmarks/ops/bench_post_norm_gate_up.py --tile 2,512,8 --tile 4,1024,6
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _graph_timing import interleaved_graphs  # noqa: E402
from _timing import format_table  # noqa: E402

from tilegym.ops import add_norm_gate_up, gemm, rms_norm  # noqa: E402
from tilegym.ops.gemm_configs import TileConfig  # noqa: E402

#: (hidden, intermediate) of the post-norm presets' MLPs
SHAPES = {"olmo3": (4096, 11008), "olmo2": (2048, 8192)}
EPS = 1e-6


def parse_tile(text: str) -> TileConfig:
    """``TN,TK[,OCC]`` -> a one-row GEMV tile (one-line ValueError otherwise)."""
    parts = text.split(",")
    if len(parts) not in (2, 3) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--tile {text!r}: want TN,TK[,OCC], positive integers")
    tn, tk, *occ = (int(p) for p in parts)
    try:
        return TileConfig(1, tn, tk, gemv=True, occupancy=occ[0] if occ else 0)
    except ValueError as exc:
        raise ValueError(f"--tile {text!r}: {exc}") from None


def sides(k: int, i: int, layers: int, tiles: list[TileConfig]) -> dict:
    """{name: one decode step's calls over ``layers`` weights} for one shape."""
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(torch.bfloat16)

    o, r, nw = rand(1, k, scale=3.0), rand(1, k), rand(k, scale=0.2) + 1
    weights = [rand(2 * i, k, scale=k**-0.5) for _ in range(layers)]

    def two_launches():
        for w in weights:
            h = rms_norm.rms_norm_add(o, r, nw, EPS)[0]
            gemm.fused_gate_up_silu(h, w)

    def fused(cfg):
        def step():
            for w in weights:
                add_norm_gate_up.add_rms_norm_gate_up(o, r, nw, EPS, w, config=cfg)

        return step

    out = {"rms_norm_add + gate/up (table)": two_launches}
    for cfg in [add_norm_gate_up.TILE, *tiles]:
        out[f"fused 1x{cfg.tn}x{cfg.tk} occ {cfg.occupancy}"] = fused(cfg)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--tile", action="append", default=[], metavar="TN,TK[,OCC]")
    parser.add_argument("--layers", type=int, default=8, help="weights a graph streams over")
    parser.add_argument("--replays", type=int, default=20)
    args = parser.parse_args(argv)
    try:
        tiles = [parse_tile(t) for t in args.tile]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}")
    rows = []
    for model in args.models:
        k, i = SHAPES[model]
        times = interleaved_graphs(sides(k, i, args.layers, tiles), 1, args.replays)
        base = times["rms_norm_add + gate/up (table)"][0]
        weight_gb = 2 * i * k * 2 / 1e9
        for name, (med, lo, hi) in times.items():
            per_call = med / args.layers
            tbps = weight_gb / (per_call * 1e-6) / 1e3
            rows.append(
                [model, name, per_call, f"{lo / args.layers:.1f}-{hi / args.layers:.1f}",
                 f"{tbps:.2f}", f"{base / med:.3f}x"]
            )  # fmt: skip
    print(format_table(["model", "side", "us a layer", "min-max", "weight TB/s", "vs two"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
