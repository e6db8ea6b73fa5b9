"""RMSNorm and fused add+RMSNorm: cuTile vs the PyTorch ops they replace (H200 table).

Table 1: the model shapes (decode M=1, 8; prefill M=2048) and the 8192x4096 headline with
torch, the first kernel ("old") and the library default. Table 2: every variant of
``tilegym.ops.rms_norm.VARIANTS`` interleaved at the large shapes (default marked ``*``).
``--warm I/N`` only launches (fills the kernel cache; see _sweep.py).
"""

from __future__ import annotations

import os
import sys
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _shapes import MODELS, TOKENS  # noqa: E402
from _sweep import parse_args, print_sweep, warm  # noqa: E402

from tilegym.ops import rms_norm as rn  # noqa: E402


def _default_name(occ, pers) -> str:
    for name, kw in rn.VARIANTS.items():
        if (kw["tile_elems"], kw["occupancy"], kw["persistent"]) == (rn.TILE_ELEMS, occ, pers):
            return name
    return "?"


DEFAULTS = {
    "rms_norm": _default_name(rn.OCCUPANCY, rn.PERSISTENT),
    "add_rms_norm": _default_name(rn.ADD_OCCUPANCY, rn.PERSISTENT),
}


def _inputs(m, n, dt=torch.bfloat16):
    x = torch.randn(m, n, device="cuda", dtype=dt)
    return x, torch.randn(m, n, device="cuda", dtype=dt), torch.randn(n, device="cuda", dtype=dt)


def _pair(m, n, variants):
    x, r, w = _inputs(m, n)
    plain = {"torch": partial(rn.rms_norm_reference, x, w, 1e-6)}
    fused = {"torch": partial(rn.add_rms_norm_reference, x, r, w, 1e-6)}
    for name, kw in variants.items():
        plain[name] = partial(rn.rms_norm, x, w, 1e-6, **kw)
        fused[name] = partial(rn.add_rms_norm, x, r, w, 1e-6, **kw)
    yield "rms_norm", f"{m}x{n}", plain, 2 * x.nbytes + w.nbytes
    yield "add_rms_norm", f"{m}x{n}", fused, 4 * x.nbytes + w.nbytes


def model_cases():
    """torch, the old kernel and the default at the model shapes."""
    shapes = [(t, m["hidden"]) for m in MODELS.values() for t in TOKENS]
    for m, n in [(8192, 4096), *shapes]:
        yield from _pair(m, n, {"old": rn.VARIANTS["old"], "default": {}})


def sweep_cases():
    for m, n in ((8192, 4096), (2048, 1024), (2048, 2048)):
        yield from _pair(m, n, rn.VARIANTS)


def main() -> None:
    args = parse_args()
    if args.warm:
        warm([*model_cases(), *sweep_cases()], args.warm)
        return
    print(f"defaults: {DEFAULTS} (TILE_ELEMS={rn.TILE_ELEMS})")
    print_sweep(model_cases(), {"rms_norm": "default", "add_rms_norm": "default"})
    print()
    print_sweep(sweep_cases(), DEFAULTS, iters=args.iters)


if __name__ == "__main__":
    main()
