"""RoPE (q+k in one launch) and Qwen3's fused q/k-norm + RoPE vs the PyTorch ops (H200 table).

One table: per shape (decode: 1 and 8 sequences of one token; prefill: 1x2048, 4x4096 and
8x4096 tokens) torch, every variant of ``ROPE_VARIANTS`` / ``QK_VARIANTS`` ("auto" is the
default dispatch, marked ``*``) and "copy", a ``dst.copy_(src)`` of the same bytes, all
interleaved. Columns: % of the GPU's 1 GiB copy rate and % of the measured copy (what the
harness allows at that size); at decode also back-to-back µs per call (host cost included).
Bytes: q and k read and written once, cos and sin read once. ``--warm I/N`` only launches
(fills the kernel cache; see _sweep.py); ``--models`` (qwen3 and llama unless named: any key of
``_shapes.HEADS``) / ``--shapes`` pick a subset.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _shapes import HEADS, MODELS  # noqa: E402
from _sweep import print_ceiling_sweep, warm  # noqa: E402
from _timing import flush_mode  # noqa: E402

from tilegym.ops import rope as rp  # noqa: E402

SHAPES = ["1x1", "8x1", "1x2048", "4x4096", "8x4096"]
DEFAULTS = {"rope": "auto", "qk_norm_rope": "auto"}


def _cos_sin(b, s, d, dt):
    pos = torch.arange(s, device="cuda").float().expand(b, s)
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    emb = torch.cat([pos[..., None] * inv] * 2, dim=-1)
    return emb.cos().to(dt), emb.sin().to(dt)


def _cases(key, m, b, s, dt=torch.bfloat16):
    hq, hk, d = m["hq"], m["hk"], m["d"]
    # q and k as the patch hands them over: views of one fused QKV projection output
    qkv = torch.randn(b, s, (hq + 2 * hk) * d, device="cuda", dtype=dt)
    q = qkv[..., : hq * d].view(b, s, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].view(b, s, hk, d)
    cos, sin = _cos_sin(b, s, d, dt)  # (B, S, D) as the models' rotary modules return them
    w = torch.randn(d, device="cuda", dtype=dt)
    nbytes = 2 * (hq + hk) * d * b * s * 2 + 2 * b * s * d * 2
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    fns = {"torch": partial(rp.apply_rope_reference, qt, kt, cos, sin)}
    for name, kw in rp.ROPE_VARIANTS.items():
        fns[name] = partial(rp.apply_rope, qt, kt, cos, sin, **kw)
    yield "rope", f"{key} {b}x{s}", fns, nbytes
    if key == "qwen3":
        fns = {"torch": partial(rp.qk_norm_rope_reference, q, k, w, w, 1e-6, cos, sin)}
        for name, kw in rp.QK_VARIANTS.items():
            fns[name] = partial(rp.qk_norm_rope, q, k, w, w, 1e-6, cos, sin, **kw)
        yield "qk_norm_rope", f"{key} {b}x{s}", fns, nbytes


def all_cases(models, shapes):
    for key in models:
        for shape in shapes:
            b, s = (int(v) for v in shape.split("x"))
            yield from _cases(key, HEADS[key], b, s)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--warm", default=None, help="I/N: only launch worker I's share of the cases")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--shapes", default=",".join(SHAPES))
    args = p.parse_args()
    models, shapes = args.models.split(","), args.shapes.split(",")
    unknown = sorted(set(models) - set(HEADS))
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(HEADS)}")
    if args.warm:
        warm(all_cases(models, shapes), args.warm)
        return
    print(
        f"defaults: ROPE_VARIANT={rp.ROPE_VARIANT} QK_VARIANT={rp.QK_VARIANT} "
        f"(auto: per-token kernel up to {rp.ROPE_TOKEN_MAX}/{rp.QK_TOKEN_MAX} tokens, else "
        f"the head-loop kernel); "
        f"L2 flush: {flush_mode()}"
    )
    decode = {f"{k} {s}" for k in HEADS for s in ("1x1", "8x1")}
    print_ceiling_sweep(all_cases(models, shapes), DEFAULTS, args.iters, lambda s: s in decode)


if __name__ == "__main__":
    main()
