"""RMSNorm and fused add+RMSNorm: cuTile vs the PyTorch ops they replace (H200 table).

Prints the model shapes (decode M=1, 8; prefill M=2048) and the 8192x4096 headline, then a
sweep of the elements per block (rows per block) at the large shapes.
"""

from __future__ import annotations

import os
import sys
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _shapes import MODELS, TOKENS  # noqa: E402
from _timing import format_table, interleaved, pct_of_copy, vs_torch_columns  # noqa: E402

from tilegym.ops.rms_norm import (  # noqa: E402
    add_rms_norm,
    add_rms_norm_reference,
    rms_norm,
    rms_norm_reference,
)

HEADER = ["op", "shape", "torch_us", "cutile_us", "spread%", "speedup", "GB/s", "%copy"]
SWEEP = [4096, 8192, 16384, 32768]


def shapes():
    yield 8192, 4096
    for m in MODELS.values():
        for t in TOKENS:
            yield t, m["hidden"]


def _inputs(m, n, dt=torch.bfloat16):
    x = torch.randn(m, n, device="cuda", dtype=dt)
    return x, torch.randn(m, n, device="cuda", dtype=dt), torch.randn(n, device="cuda", dtype=dt)


def main() -> None:
    rows = []
    for m, n in shapes():
        x, r, w = _inputs(m, n)
        st = interleaved(
            {
                "torch": partial(rms_norm_reference, x, w, 1e-6),
                "cutile": partial(rms_norm, x, w, 1e-6),
            }
        )
        rows.append(_row("rms_norm", f"{m}x{n}", st, 2 * x.nbytes + w.nbytes))
        st = interleaved(
            {
                "torch": partial(add_rms_norm_reference, x, r, w, 1e-6),
                "cutile": partial(add_rms_norm, x, r, w, 1e-6),
            }
        )
        rows.append(_row("add_rms_norm", f"{m}x{n}", st, 4 * x.nbytes + w.nbytes))
    print(format_table(HEADER, rows))
    sweep()


def sweep() -> None:
    rows = []
    for m, n in ((8192, 4096), (2048, 2048)):
        x, r, w = _inputs(m, n)
        fns = {}
        for elems in SWEEP:
            fns[f"rms_norm elems={elems}"] = partial(rms_norm, x, w, 1e-6, elems)
            fns[f"add_rms_norm elems={elems}"] = partial(add_rms_norm, x, r, w, 1e-6, elems)
        for name, st in interleaved(fns, iters=30).items():
            nbytes = (2 if name.startswith("rms") else 4) * x.nbytes
            rows.append([name, f"{m}x{n}", st.median_us, st.spread_pct, pct_of_copy(nbytes, st)])
    print(format_table(["variant", "shape", "us", "spread%", "%copy"], rows))


def _row(op, shape, st, nbytes):
    return [op, shape, *vs_torch_columns(st, nbytes)]


if __name__ == "__main__":
    main()
