"""MLA latent decode: key splits and key-tile widths against the shipped plan (GPU).

    TILEGYM_BENCH_FLUSH=read python benchmarks/ops/sweep_mla.py [--iters 30] [--heads 16]
        [--plan-only]

Rows: one new token per sequence over a latent cache at DeepSeek-V2-Lite's widths (latent 512,
rope 64), the static-cache form the model runs (the key range read from a device position) and
the whole-cache form of ``bench_mla.py``. Variants: ``plan`` is what ``mla_decode`` picks
(marked ``*``); ``sN/tW[/oK]`` forces N splits of W-key tiles [and an occupancy hint of K
blocks per SM]. Bytes are the cache read plus queries and output, so ``%copy`` is the kernel's
share of the GPU's copy bandwidth (measured) for the bytes it must read. Use
``TILEGYM_BENCH_FLUSH=read``: the default write flush leaves the L2 full of dirty lines that a
1-10 MB kernel then writes back (about 14 us at any size).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sweep import print_sweep  # noqa: E402

from tilegym.ops import mla  # noqa: E402

LAT, ROPE = 512, 64
SPLITS = (8, 16, 32, 64)  # fewer left most SMs idle at every shape (12-04 sweep)
TILES = (32, 64)
OCCUPANCY = (None, 2, 4)


def _variant(args, kwargs, splits: int, tile_n: int, occupancy: int | None = None):
    return lambda: mla.mla_decode(
        *args, num_splits=splits, occupancy=occupancy, tile_n=tile_n, **kwargs
    )


def case(b: int, h: int, t: int, end: int, by_position: bool, plan_only: bool = False):
    dev, bf = "cuda", torch.bfloat16
    ckv = torch.randn(b, 1, t, LAT, device=dev, dtype=bf)
    kpe = torch.randn(b, 1, t, ROPE, device=dev, dtype=bf)
    q_lat = torch.randn(b, h, LAT, device=dev, dtype=bf) * 0.1
    q_pe = torch.randn(b, h, ROPE, device=dev, dtype=bf) * 0.1
    args = (q_lat, q_pe, ckv, kpe)
    kwargs = {"scale": 0.1147}
    if by_position:
        kwargs["position"] = torch.tensor([end - 1], dtype=torch.int32, device=dev)
    else:
        kwargs["kv_end"] = end
    vis = mla.visible_keys(b, t, device=dev, kv_end=end)
    ref = mla.reference_mla_decode(q_lat, q_pe, ckv, kpe, vis, 0.1147)
    fns = {"plan": lambda: mla.mla_decode(*args, **kwargs)}
    for tile_n in () if plan_only else TILES:
        tiles = -(-t // tile_n)
        for s in SPLITS:
            for occ in OCCUPANCY:
                if s <= tiles:
                    name = f"s{s}/t{tile_n}" + (f"/o{occ}" if occ else "")
                    fns[name] = _variant(args, kwargs, s, tile_n, occ)
    for name, fn in fns.items():
        err = ((fn().float() - ref).norm() / ref.norm()).item()
        if not err < 1e-2:
            raise SystemExit(f"error: {name} at b={b} t={t}: relative error {err:.2e}")
    nbytes = 2 * (b * end * (LAT + ROPE) + b * h * (LAT + ROPE) + b * h * LAT)
    form = "pos" if by_position else "end"
    return ("mla_decode", f"{b}x{end}/{t}{form}", fns, nbytes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--plan-only", action="store_true", help="only the shipped plan a shape")
    args = ap.parse_args()
    shapes = [
        (1, 2176, 2100, True),
        (8, 2176, 2100, True),
        (1, 4096, 4096, False),
        (8, 4096, 4096, False),
        (8, 4096, 4096, True),
        (8, 8192, 8192, False),
    ]
    cases = (case(b, args.heads, t, end, pos, args.plan_only) for b, t, end, pos in shapes)
    print_sweep(cases, {"mla_decode": "plan"}, iters=args.iters)


if __name__ == "__main__":
    main()
