"""SiLU-and-mul, residual add and embedding lookup vs the PyTorch ops they replace (H200 table)."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _shapes import MODELS, TOKENS  # noqa: E402
from _timing import format_table, interleaved, pct_of_copy, vs_torch_columns  # noqa: E402

from tilegym.ops.elementwise import add, add_reference  # noqa: E402
from tilegym.ops.embedding import embedding, embedding_reference  # noqa: E402
from tilegym.ops.silu_and_mul import silu_and_mul, silu_and_mul_reference  # noqa: E402

HEADER = ["op", "model", "shape", "torch_us", "cutile_us", "spread%", "speedup", "GB/s", "%copy"]


def main() -> None:
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
    rows = []
    for n in (1024 * 2048, 2048 * 2048):
        a = torch.randn(n, device="cuda", dtype=dt)
        b = torch.randn_like(a)
        fns = {"torch add": lambda a=a, b=b: a + b}
        for tile in (2048, 4096, 8192):
            fns[f"add tile={tile}"] = lambda a=a, b=b, tile=tile: add(a, b, tile)
        for name, st in interleaved(fns, iters=30).items():
            rows.append([name, n, st.median_us, st.spread_pct, pct_of_copy(6 * n, st)])
    print(format_table(["variant", "elements", "us", "spread%", "%copy"], rows))


def _row(op, key, shape, st, nbytes):
    return [op, key, shape, *vs_torch_columns(st, nbytes)]


if __name__ == "__main__":
    main()
