"""RoPE (q+k in one launch) and Qwen3's fused q/k-norm + RoPE vs the PyTorch ops (H200 table).

Rows: decode (1 and 8 sequences of one token), prefill (2048 tokens) and a 4x4096-token shape
for the bandwidth figure.
"""

from __future__ import annotations

import os
import sys
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _shapes import MODELS, TOKENS  # noqa: E402
from _timing import format_table, interleaved, vs_torch_columns  # noqa: E402

from tilegym.ops.rope import (  # noqa: E402
    apply_rope,
    apply_rope_reference,
    qk_norm_rope,
    qk_norm_rope_reference,
)

HEADER = ["op", "model", "BxS", "torch_us", "cutile_us", "spread%", "speedup", "GB/s", "%copy"]


def _cos_sin(b, s, d, dt):
    pos = torch.arange(s, device="cuda").float().expand(b, s)
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    emb = torch.cat([pos[..., None] * inv] * 2, dim=-1)
    return emb.cos().to(dt), emb.sin().to(dt)


def _case(m, b, s, dt=torch.bfloat16):
    hq, hk, d = m["hq"], m["hk"], m["d"]
    qkv = torch.randn(b, s, (hq + 2 * hk) * d, device="cuda", dtype=dt)
    q = qkv[..., : hq * d].view(b, s, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].view(b, s, hk, d)
    cos, sin = _cos_sin(b, s, d, dt)
    w = torch.randn(d, device="cuda", dtype=dt)
    nbytes = 2 * (hq + hk) * d * b * s * 2 + 2 * b * s * d * 2
    return q, k, w, cos, sin, nbytes


def main() -> None:
    rows = []
    for key, m in MODELS.items():
        shapes = [(t, 1) if t <= 8 else (1, t) for t in TOKENS] + [(4, 4096)]
        for b, s in shapes:
            q, k, w, cos, sin, nbytes = _case(m, b, s)
            qt, kt = q.transpose(1, 2), k.transpose(1, 2)
            st = interleaved(
                {
                    "torch": partial(apply_rope_reference, qt, kt, cos, sin),
                    "cutile": partial(apply_rope, qt, kt, cos, sin),
                }
            )
            rows.append(_row("rope", key, f"{b}x{s}", st, nbytes))
            if key == "qwen3":
                st = interleaved(
                    {
                        "torch": partial(qk_norm_rope_reference, q, k, w, w, 1e-6, cos, sin),
                        "cutile": partial(qk_norm_rope, q, k, w, w, 1e-6, cos, sin),
                    }
                )
                rows.append(_row("qk_norm_rope", key, f"{b}x{s}", st, nbytes))
    print(format_table(HEADER, rows))


def _row(op, key, shape, st, nbytes):
    return [op, key, shape, *vs_torch_columns(st, nbytes)]


if __name__ == "__main__":
    main()
