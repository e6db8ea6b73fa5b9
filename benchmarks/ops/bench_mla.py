"""MLA decode (DeepSeek V2/V3) on the GPU: the latent-cache kernel against the expanded form.

    python benchmarks/ops/bench_mla.py [--json FILE] [--heads 16] [--batches 1,8]
        [--caches 1024,4096,8192]

One new token per sequence over a cache of T tokens at DeepSeek-V2-Lite's widths (latent 512,
rope 64, nope 128, v 128; ``--heads 128`` for V3), bf16:

- ``latent``: ``tilegym.ops.mla.mla_decode`` alone (reads the cache once: ``T x (512 + 64)``
  values a sequence, plus the queries and its split partials);
- ``latent+absorb``: the absorbed step the model runs (``q_nope @ W_UK``, the kernel,
  ``ctx @ W_UV``: two PyTorch ``bmm``);
- ``expanded``: what transformers does per step: ``kv_b_proj`` of the whole latent cache into
  per-head keys and values, then SDPA over ``[k_nope, k_pe]`` keys.

Columns: median microseconds (CUDA events, L2 flushed, variants interleaved), the latent
kernel's bytes (cache + queries + output) and its share of the running GPU's copy bandwidth
(``_timing.copy_tbps``, measured), and the expanded form's bytes per step for comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import format_table, gbps, interleaved, pct_of_copy  # noqa: E402

from tilegym.ops import mla  # noqa: E402

LAT, ROPE, NOPE, V = 512, 64, 128, 128


def case(b: int, h: int, t: int, scale: float = 0.1147) -> dict:
    dev, bf = "cuda", torch.bfloat16
    ckv = torch.randn(b, 1, t, LAT, device=dev, dtype=bf)
    kpe = torch.randn(b, 1, t, ROPE, device=dev, dtype=bf)
    q_nope = torch.randn(b, h, NOPE, device=dev, dtype=bf) * 0.1
    q_pe = torch.randn(b, h, ROPE, device=dev, dtype=bf) * 0.1
    w = torch.randn(h * (NOPE + V), LAT, device=dev, dtype=bf) * 0.02
    w_uk, w_uv = mla.split_kv_b_weight(w, h, NOPE, V)
    q_lat = mla.absorb_query(q_nope, w_uk).contiguous()

    def latent():
        return mla.mla_decode(q_lat, q_pe, ckv, kpe, scale=scale)

    def absorbed():
        ctx = mla.mla_decode(mla.absorb_query(q_nope, w_uk), q_pe, ckv, kpe, scale=scale)
        return mla.latent_to_heads(ctx, w_uv)

    def expanded():
        kv = torch.nn.functional.linear(ckv[:, 0], w).view(b, t, h, NOPE + V)
        k = torch.cat((kv[..., :NOPE], kpe[:, 0, :, None].expand(b, t, h, ROPE)), -1)
        q = torch.cat((q_nope, q_pe), -1)[:, :, None]
        return torch.nn.functional.scaled_dot_product_attention(
            q, k.transpose(1, 2), kv[..., NOPE:].transpose(1, 2), scale=scale
        )

    ref = mla.reference_mla_decode(
        q_lat, q_pe, ckv, kpe, torch.ones(b, t, dtype=torch.bool, device=dev), scale
    )
    err = (latent().float() - ref).norm() / ref.norm()
    stats = interleaved({"latent": latent, "latent+absorb": absorbed, "expanded": expanded})
    nbytes = 2 * (b * t * (LAT + ROPE) + b * h * (LAT + ROPE) + b * h * LAT)
    expanded_bytes = 2 * (b * t * LAT + h * (NOPE + V) * LAT + 3 * b * t * h * (NOPE + ROPE + V))
    return {
        "batch": b,
        "heads": h,
        "cache": t,
        "rel_err": float(err),
        "us": {k: s.median_us for k, s in stats.items()},
        "spread_pct": {k: s.spread_pct for k, s in stats.items()},
        "latent_bytes": nbytes,
        "latent_gbps": gbps(nbytes, stats["latent"]),
        "latent_pct_of_copy": pct_of_copy(nbytes, stats["latent"]),
        "expanded_bytes_min": expanded_bytes,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--caches", default="1024,4096,8192")
    args = ap.parse_args()
    rows, out = [], []
    for b in map(int, args.batches.split(",")):
        for t in map(int, args.caches.split(",")):
            r = case(b, args.heads, t)
            out.append(r)
            us = r["us"]
            rows.append(
                [
                    b,
                    t,
                    us["latent"],
                    us["latent+absorb"],
                    us["expanded"],
                    r["latent_bytes"] / 1e6,
                    r["latent_pct_of_copy"],
                    r["expanded_bytes_min"] / 1e6,
                    f"{r['rel_err']:.1e}",
                ]
            )
    header = [
        "batch",
        "cache",
        "latent us",
        "absorb us",
        "expanded us",
        "latent MB",
        "% copy",
        "expanded MB",
        "rel err",
    ]
    print(format_table(header, rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
