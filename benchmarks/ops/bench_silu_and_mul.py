"""SiLU-and-mul and embedding lookup vs the PyTorch ops they replace (H200 table).

One table: both ops with their defaults at the model shapes (``_shapes.MODELS`` x ``TOKENS``),
cuTile and torch interleaved per shape.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _shapes import MODELS, TOKENS  # noqa: E402
from _timing import format_table, interleaved, vs_torch_columns  # noqa: E402

from tilegym.ops.embedding import embedding, embedding_reference  # noqa: E402
from tilegym.ops.silu_and_mul import silu_and_mul, silu_and_mul_reference  # noqa: E402

HEADER = ["op", "model", "shape", "torch_us", "cutile_us", "spread%", "speedup", "GB/s", "%copy"]


def main() -> None:
    model_table()


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
