"""The GEMV kernel with and without programmatic dependent launch (``gemm.GEMV_PDL``), in a
decode-like chain: LAYERS x (RMSNorm -> copy into the GEMV's input -> one-row GEMV + residual),
each layer its own weight (so weights stream from HBM), at qwen3-0.6B's o_proj and down_proj
shapes (hidden 1024). One CUDA graph per variant, captured with the constant set; the graphs
replay in turn (``_graph_timing``); medians of ``--replays`` replays, with min-max range,
microseconds per layer and the weights' read rate; the two variants' outputs must be equal
bit for bit.

    python benchmarks/ops/bench_gemv_pdl.py [--layers 28] [--replays 30]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _graph_timing import interleaved_graphs  # noqa: E402
from _timing import format_table  # noqa: E402

from tilegym.ops import gemm  # noqa: E402
from tilegym.ops.rms_norm import rms_norm  # noqa: E402

HIDDEN = 1024
SHAPES = {"o_proj": 2048, "down_proj": 3072}


def chain(k: int, layers: int, gen: torch.Generator, pdl: bool):
    """A function running the chain (the GEMV launched with ``pdl``) and its output tensor."""
    h0 = torch.randn(1, HIDDEN, device="cuda", generator=gen).bfloat16()
    ws = [
        torch.randn(HIDDEN, k, device="cuda", generator=gen).bfloat16() / k**0.5
        for _ in range(layers)
    ]
    nw = (torch.rand(HIDDEN, device="cuda", generator=gen) + 0.5).bfloat16()
    xs = [torch.randn(1, k, device="cuda", generator=gen).bfloat16() for _ in range(layers)]
    out = torch.empty_like(h0)

    def run():
        saved, gemm.GEMV_PDL = gemm.GEMV_PDL, pdl
        try:
            h = h0
            for w, x in zip(ws, xs, strict=True):
                x[:, :HIDDEN].copy_(rms_norm(h, nw, 1e-6))
                h = gemm.linear_residual(x, w, h)
            out.copy_(h)
        finally:
            gemm.GEMV_PDL = saved

    return run, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--replays", type=int, default=30)
    args = ap.parse_args()
    print(torch.cuda.get_device_name())
    rows = []
    for name, k in SHAPES.items():
        fns, outs = {}, {}
        for pdl in (False, True):
            gen = torch.Generator(device="cuda").manual_seed(0)  # the same weights either way
            fns[pdl], outs[pdl] = chain(k, args.layers, gen, pdl)
        times = interleaved_graphs(fns, calls=1, replays=args.replays)
        equal = torch.equal(outs[False], outs[True])
        nbytes = args.layers * HIDDEN * k * 2
        for pdl, (med, lo, hi) in times.items():
            per_layer = med / args.layers
            rows.append(
                [
                    name,
                    f"{HIDDEN}x{k}",
                    pdl,
                    f"{med:.1f}",
                    f"{lo:.1f}-{hi:.1f}",
                    f"{per_layer:.2f}",
                    f"{nbytes / med / 1e6:.2f}",
                    equal,
                ]
            )
    header = ["shape", "W", "pdl", "us/chain", "range", "us/layer", "W TB/s", "equal"]
    print(format_table(header, rows))


if __name__ == "__main__":
    main()
