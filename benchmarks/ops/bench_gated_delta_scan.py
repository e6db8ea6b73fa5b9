"""The gated delta rule's chunk scan by value-block width: one kernel or split, against fla.

The scan walks the chunks in order, one program per (value block, head): at 16 heads of 128
values and 32-column blocks that is 64 programs on a 132-SM GPU, each doing a chain of small
products. Narrower value blocks give more programs and shorter chains a step; wider ones fewer
key loads. This table times the whole prefill (the shipped prep, then each scan form) with the
value block ``bv`` of the scan (or of the split scan's state pass) and ``out_bv`` of the split
scan's output kernel, variants interleaved, medians with the p10-p90 spread; ``err`` is the
relative error from the fp32 recurrent reference. ``--kernels`` adds each form's time by kernel.

    python benchmarks/ops/bench_gated_delta_scan.py [--heads 0.8b 16/32] [--tokens 2048]

fla is optional, as in ``bench_gated_delta.py`` (on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import format_table  # noqa: E402
from bench_gated_delta import (  # noqa: E402
    HEADS,
    _fla,
    _fla_chunk,
    _inputs,
    _print_kernel_times,
    _row,
)

from tilegym.ops import gated_delta as gd  # noqa: E402

#: value-block widths of the one-kernel scan beside the shipped ``SCAN_BV``
SCAN_WIDTHS = (16, 64)
#: (state pass bv, output kernel out_bv) of the split scan
SPLIT_WIDTHS = ((32, 64), (16, 64), (16, 32), (32, 128), (64, 64))


def forms(x) -> dict:
    """Name -> call of every scan form on inputs ``x``; ``cutile`` is the shipped one."""
    out = {"cutile": partial(gd.gated_delta_chunk, *x)}
    for bv in SCAN_WIDTHS:
        out[f"bv{bv}"] = partial(gd.gated_delta_chunk, *x, split=False, bv=bv)
    for bv, obv in SPLIT_WIDTHS:
        call = partial(gd.gated_delta_chunk, *x, split=True, bv=bv, out_bv=obv)
        out[f"split bv{bv} out{obv}"] = call
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--heads", nargs="*", default=list(HEADS), choices=list(HEADS))
    p.add_argument("--tokens", type=int, nargs="*", default=[2048])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--kernels", action="store_true", help="each form's time by kernel")
    args = p.parse_args()
    fla_chunk, _ = _fla()
    header = ["heads", "tokens", "form", "us", "/cutile", "err"]
    rows = []
    for hname in args.heads:
        for n_tok in args.tokens:
            x = _inputs(1, n_tok, HEADS[hname])
            g, beta = gd.gates_reference(*x[3:])
            ref = gd.recurrent_reference(*x[:3], g, beta)[0] if n_tok <= 2048 else None
            fns = forms(x)
            if args.kernels:
                _print_kernel_times(f"{hname} 1x{n_tok}", dict(fns), args.iters)
            if fla_chunk is not None:
                fns["fla"] = partial(_fla_chunk, fla_chunk, *x)
            cols = list(fns)
            row = _row(f"{hname} 1x{n_tok}", fns, ref, args.warmup, args.iters, cols)
            for i, name in enumerate(cols):
                rows.append([hname, n_tok, name, *row[1 + 3 * i : 4 + 3 * i]])
            print(format_table(header, rows[-len(cols) :]), flush=True)
    print(format_table(header, rows))


if __name__ == "__main__":
    main()
