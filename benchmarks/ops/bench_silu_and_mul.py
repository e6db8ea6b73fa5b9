"""SiLU-and-mul, residual add and embedding lookup vs the PyTorch ops they replace (H200 table).

Table 1: the three ops with their defaults at the model shapes. Table 2: every residual-add
variant of ``elementwise.VARIANTS`` ("default" marked ``*``) against torch ``a + b`` and a
``dst.copy_(src)`` of the same bytes, interleaved, at decode (1x1024, 8x2048) and prefill
(2048x1024, 2048x2048, 8192x4096) shapes. ``--ops add`` runs only table 2; ``--warm I/N`` only
launches table 2's variants (fills the kernel cache).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _shapes import MODELS, TOKENS  # noqa: E402
from _sweep import print_ceiling_sweep, warm  # noqa: E402
from _timing import flush_mode, format_table, interleaved, vs_torch_columns  # noqa: E402

from tilegym.ops import elementwise as ew  # noqa: E402
from tilegym.ops.elementwise import add, add_reference  # noqa: E402
from tilegym.ops.embedding import embedding, embedding_reference  # noqa: E402
from tilegym.ops.silu_and_mul import silu_and_mul, silu_and_mul_reference  # noqa: E402

HEADER = ["op", "model", "shape", "torch_us", "cutile_us", "spread%", "speedup", "GB/s", "%copy"]


ADD_SHAPES = [(1, 1024), (8, 2048), (2048, 1024), (2048, 2048), (8192, 4096)]


def add_cases():
    for m, n in ADD_SHAPES:
        a = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn_like(a)
        fns = {"torch": lambda a=a, b=b: a + b}
        for name, kw in ew.VARIANTS.items():
            fns[name] = lambda a=a, b=b, kw=kw: add(a, b, **kw)
        yield "add", f"{m}x{n}", fns, 3 * 2 * a.numel()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ops", default="all", help="all, or add: only the residual-add sweep")
    p.add_argument("--warm", default=None, help="I/N: only launch worker I's share of the cases")
    p.add_argument("--iters", type=int, default=30)
    args = p.parse_args()
    if args.warm:
        warm(add_cases(), args.warm)
        return
    if args.ops == "all":
        model_table()
        print()
    print(
        f"add: TILE={ew.TILE} MIN_TILE={ew.MIN_TILE} OCCUPANCY={ew.OCCUPANCY}; flush {flush_mode()}"
    )
    print_ceiling_sweep(
        add_cases(), {"add": "default"}, args.iters, lambda s: s in ("1x1024", "8x2048")
    )


def model_table() -> None:
    rows = []
    dt = torch.bfloat16
    for key, m in MODELS.items():
        for t in TOKENS:
            gu = torch.randn(t, 2 * m["inter"], device="cuda", dtype=dt)
            st = interleaved(
                {
                    "torch": lambda gu=gu: silu_and_mul_reference(gu),
                    "cutile": lambda gu=gu: silu_and_mul(gu),
                }
            )
            rows.append(_row("silu_and_mul", key, f"{t}x{m['inter']}", st, 3 * gu.numel()))
            a = torch.randn(t, m["hidden"], device="cuda", dtype=dt)
            b = torch.randn_like(a)
            st = interleaved(
                {
                    "torch": lambda a=a, b=b: add_reference(a, b),
                    "cutile": lambda a=a, b=b: add(a, b),
                }
            )
            rows.append(_row("add", key, f"{t}x{m['hidden']}", st, 3 * 2 * a.numel()))
            w = torch.randn(m["vocab"], m["hidden"], device="cuda", dtype=dt)
            ids = torch.randint(0, m["vocab"], (1, t), device="cuda")
            st = interleaved(
                {
                    "torch": lambda ids=ids, w=w: embedding_reference(ids, w),
                    "cutile": lambda ids=ids, w=w: embedding(ids, w),
                }
            )
            rows.append(_row("embedding", key, f"{t}x{m['hidden']}", st, 2 * 2 * t * m["hidden"]))
    print(format_table(HEADER, rows))


def _row(op, key, shape, st, nbytes):
    return [op, key, shape, *vs_torch_columns(st, nbytes)]


if __name__ == "__main__":
    main()
