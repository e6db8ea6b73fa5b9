"""RoPE (q+k in one launch) and Qwen3's fused q/k-norm + RoPE vs the PyTorch ops (H200 table).

Table 1: decode (1 and 8 sequences of one token), prefill (2048 tokens) and 4x4096 tokens with
torch, the first (one block per token) kernel and the default. Table 2: every variant of
``ROPE_VARIANTS`` / ``QK_VARIANTS`` interleaved at 2048 and 4x4096 tokens (default marked
``*``). ``--warm I/N`` only launches (fills the kernel cache; see _sweep.py).
"""

from __future__ import annotations

import os
import sys
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _shapes import MODELS, TOKENS  # noqa: E402
from _sweep import parse_args, print_sweep, warm  # noqa: E402

from tilegym.ops import rope as rp  # noqa: E402


def _default_name(variants, tokens, occ) -> str:
    for name, kw in variants.items():
        if kw.get("tokens") == tokens and kw.get("occupancy") == occ:
            return name
    return "?"


DEFAULTS = {
    "rope": _default_name(rp.ROPE_VARIANTS, rp.ROPE_TOKENS, rp.ROPE_OCCUPANCY),
    "qk_norm_rope": _default_name(rp.QK_VARIANTS, rp.QK_TOKENS, rp.QK_OCCUPANCY),
}


def _cos_sin(b, s, d, dt):
    pos = torch.arange(s, device="cuda").float().expand(b, s)
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    emb = torch.cat([pos[..., None] * inv] * 2, dim=-1)
    return emb.cos().to(dt), emb.sin().to(dt)


def _cases(key, m, b, s, rope_variants, qk_variants, dt=torch.bfloat16):
    hq, hk, d = m["hq"], m["hk"], m["d"]
    qkv = torch.randn(b, s, (hq + 2 * hk) * d, device="cuda", dtype=dt)
    q = qkv[..., : hq * d].view(b, s, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].view(b, s, hk, d)
    cos, sin = _cos_sin(b, s, d, dt)
    w = torch.randn(d, device="cuda", dtype=dt)
    # q and k read and written once, plus cos and sin read once
    nbytes = 2 * (hq + hk) * d * b * s * 2 + 2 * b * s * d * 2
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    fns = {"torch": partial(rp.apply_rope_reference, qt, kt, cos, sin)}
    for name, kw in rope_variants.items():
        fns[name] = partial(rp.apply_rope, qt, kt, cos, sin, **kw)
    yield "rope", f"{key} {b}x{s}", fns, nbytes
    if key == "qwen3":
        fns = {"torch": partial(rp.qk_norm_rope_reference, q, k, w, w, 1e-6, cos, sin)}
        for name, kw in qk_variants.items():
            fns[name] = partial(rp.qk_norm_rope, q, k, w, w, 1e-6, cos, sin, **kw)
        yield "qk_norm_rope", f"{key} {b}x{s}", fns, nbytes


def model_cases():
    old_new = {"old": rp.ROPE_VARIANTS["token"], "default": {}}
    for key, m in MODELS.items():
        for b, s in [(t, 1) if t <= 8 else (1, t) for t in TOKENS] + [(4, 4096)]:
            yield from _cases(key, m, b, s, old_new, old_new)


def sweep_cases():
    for key, m in MODELS.items():
        for b, s in ((1, 2048), (4, 4096)):
            yield from _cases(key, m, b, s, rp.ROPE_VARIANTS, rp.QK_VARIANTS)


def main() -> None:
    args = parse_args()
    if args.warm:
        warm([*model_cases(), *sweep_cases()], args.warm)
        return
    print(f"defaults: {DEFAULTS} (ROPE_VARIANT={rp.ROPE_VARIANT}, QK_VARIANT={rp.QK_VARIANT})")
    print_sweep(model_cases(), {"rope": "default", "qk_norm_rope": "default"})
    print()
    print_sweep(sweep_cases(), DEFAULTS, iters=args.iters)


if __name__ == "__main__":
    main()
