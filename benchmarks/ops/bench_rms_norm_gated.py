"""Qwen3.5's gated RMSNorm at decode and prefill row counts: rows a block, plain loads vs TMA.

Each variant runs 50 times back to back in one CUDA graph (``_graph_timing``: what a decode
step's replay sees, launch gaps included); the variants' graphs replay in turn, medians of 20
replays in microseconds per call with the min-max range. ``shipped`` is ``rms_norm_gated`` as
the model calls it (``tile_sizes``); ``plain tN`` / ``tma tN`` force N rows a block with plain
or TMA loads and store (``tile_rows``, ``tma``); the control is the plain RMSNorm at a
Llama-like hidden size. ``err`` is each variant's relative error against the fp32 reference.

    python benchmarks/ops/bench_rms_norm_gated.py [--rows 16 48 128 32768]
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _graph_timing import interleaved_graphs  # noqa: E402
from _timing import format_table  # noqa: E402

from tilegym.ops import rms_norm_gated as rg  # noqa: E402
from tilegym.ops.rms_norm import rms_norm  # noqa: E402
from tilegym.ops.testing import rel_err  # noqa: E402

HEAD_DIM = 128
EPS = 1e-6


def variants(x, z, w) -> dict:
    out = {"shipped": partial(rg.rms_norm_gated, x, z, w, EPS)}
    for rows in (64, 16, 4, 1):
        for tma in (True, False):
            name = f"{'tma' if tma else 'plain'} t{rows}"
            out[name] = partial(rg.rms_norm_gated, x, z, w, EPS, tile_rows=rows, tma=tma)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="*", default=[16, 48, 128, 32768])
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(torch.cuda.get_device_name())
    table = []
    for m in args.rows:
        x = torch.randn(m, HEAD_DIM, device="cuda", generator=gen).bfloat16()
        z = torch.randn(m, HEAD_DIM, device="cuda", generator=gen).bfloat16() * 3
        w = (torch.rand(HEAD_DIM, device="cuda", generator=gen) + 0.5).bfloat16()
        ref = rg.rms_norm_gated_reference(x.float(), z.float(), w.float(), EPS)
        fns = variants(x, z, w)
        errs = {name: rel_err(fn().float(), ref) for name, fn in fns.items()}
        xn = torch.randn(max(1, m // 16), 2048, device="cuda", generator=gen).bfloat16()
        control = f"control rms_norm {tuple(xn.shape)}"
        fns[control] = partial(rms_norm, xn, torch.ones(2048, device="cuda").bfloat16(), EPS)
        for name, (med, lo, hi) in interleaved_graphs(fns).items():
            err = f"{errs[name]:.2e}" if name in errs else "-"
            table.append([m, name, f"{med:.2f}", f"{lo:.2f}-{hi:.2f}", err])
    print(format_table(["rows", "variant", "us/call", "range", "err"], table))


if __name__ == "__main__":
    main()
