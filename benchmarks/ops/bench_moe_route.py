"""The MoE router kernel at the families' widths: rows a program, max + argmax vs packed keys.

Each variant runs 50 times back to back in one CUDA graph (``_graph_timing``: what a decode
step's replay sees, launch gaps included); the variants' graphs replay in turn, medians of 20
replays in microseconds per call with the min-max range. ``shipped`` is ``moe_route`` as the
models call it (``route_tiles``' rows, ``ROUTE_PACKED``); ``tN`` forces N tokens a program,
``packed`` the one-maximum-a-round keys (``packed=True``). ``same`` says whether a variant chose
the shipped kernel's experts for every token.

    python benchmarks/ops/bench_moe_route.py [--tokens 1 8 64 2048] [--routers qwen3_next ...]
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

from tilegym.ops import moe  # noqa: E402

#: (experts, top k, renormalized) of the families whose router is ``moe_route``
ROUTERS = {
    "qwen3_next": (512, 10, True),
    "qwen3_moe": (128, 8, True),
    "olmoe": (64, 8, False),
    "gpt_oss": (32, 4, True),
    "mixtral": (8, 2, True),
}


def variants(logits, top_k, normalize) -> dict:
    route = partial(moe.moe_route, logits, top_k, normalize)
    out = {"shipped": route}
    for packed in (False, True):
        for rows in (None, 1, 8):
            if rows is None and not packed:
                continue
            name = " ".join(filter(None, ["packed" if packed else "", rows and f"t{rows}"]))
            out[name] = partial(route, tile_rows=rows, packed=packed)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="*", default=[1, 8, 64, 2048])
    ap.add_argument("--routers", nargs="*", default=list(ROUTERS), choices=list(ROUTERS))
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(torch.cuda.get_device_name())
    table = []
    for key in args.routers:
        experts, top_k, normalize = ROUTERS[key]
        for t in args.tokens:
            logits = (torch.randn(t, experts, device="cuda", generator=gen) * 3).bfloat16()
            fns = variants(logits, top_k, normalize)
            _, want = fns["shipped"]()
            same = {name: bool(torch.equal(fn()[1], want)) for name, fn in fns.items()}
            for name, (med, lo, hi) in interleaved_graphs(fns).items():
                row = [key, t, name, f"{med:.2f}", f"{lo:.2f}-{hi:.2f}", same[name]]
                table.append(row)
    print(format_table(["router", "tokens", "variant", "us/call", "range", "same"], table))


if __name__ == "__main__":
    main()
