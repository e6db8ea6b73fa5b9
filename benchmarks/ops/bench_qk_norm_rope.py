"""OLMo's whole-projection q/k RMSNorm + RoPE: the fused kernel against what it replaces.

One table per shape (olmo3's 32 + 32 heads x 128 unless ``--heads`` says otherwise; decode
1x1 and 8x1, prefill 1x2048 by default): every launch shape of
``qk_norm_whole_rope.VARIANTS`` ("auto" = the default dispatch), the unfused cuTile path the
attention forward ran before (two whole-width ``rms_norm`` launches + ``apply_rope``: "3-launch")
and PyTorch eager (upstream's ops: "torch"), all interleaved. Columns: median GPU us per call,
p10/p90 and their spread, speedup over "3-launch" and "torch". Inputs as the model hands them
over: q and k views of one fused QKV output, fp32 tables (OLMo 2/3), bf16.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import flush_mode, format_table, interleaved  # noqa: E402

from tilegym.ops import qk_norm_whole_rope as qw  # noqa: E402
from tilegym.ops.rms_norm import rms_norm  # noqa: E402
from tilegym.ops.rope import apply_rope  # noqa: E402

SHAPES = ["1x1", "8x1", "1x2048"]
EPS = 1e-6


def three_launches(q, k, wq, wk, cos, sin):
    """The unfused cuTile path: whole-width q and k RMSNorm, then RoPE on the per-head views."""
    b, s, hq, d = q.shape
    hk = k.shape[2]
    qn = rms_norm(q.reshape(b, s, hq * d), wq, EPS).view(b, s, hq, d)
    kn = rms_norm(k.reshape(b, s, hk * d), wk, EPS).view(b, s, hk, d)
    return apply_rope(qn.transpose(1, 2), kn.transpose(1, 2), cos, sin)


def case(b: int, s: int, hq: int, hk: int, d: int, dt=torch.bfloat16) -> dict:
    qkv = torch.randn(b, s, (hq + 2 * hk) * d, device="cuda", dtype=dt)
    q = qkv[..., : hq * d].view(b, s, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].view(b, s, hk, d)
    wq = (1 + 0.1 * torch.randn(hq * d, device="cuda")).to(dt)
    wk = (1 + 0.1 * torch.randn(hk * d, device="cuda")).to(dt)
    pos = torch.arange(s, device="cuda").float().expand(b, s) + 100
    inv = 1.0 / (5e5 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    emb = torch.cat([pos[..., None] * inv] * 2, dim=-1)
    cos, sin = emb.cos(), emb.sin()  # (B, S, D) fp32, as Olmo3RotaryEmbedding returns them
    args = (q, k, wq, wk, EPS, cos, sin)
    fns = {name: partial(qw.qk_norm_whole_rope, *args, **kw) for name, kw in qw.VARIANTS.items()}
    fns["3-launch"] = partial(three_launches, q, k, wq, wk, cos, sin)
    fns["torch"] = partial(qw.qk_norm_whole_rope_reference, *args)
    return fns


def rows(shape: str, fns: dict, iters: int) -> list[list[object]]:
    stats = interleaved(fns, iters=iters)
    base, eager = stats["3-launch"].median_us, stats["torch"].median_us
    out = []
    for name, st in stats.items():
        out.append(
            [
                shape,
                name,
                st.median_us,
                st.p10_us,
                st.p90_us,
                st.spread_pct,
                f"{base / st.median_us:.2f}x",
                f"{eager / st.median_us:.2f}x",
            ]
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help="BxS,... (default %(default)s)")
    p.add_argument("--heads", default="32,32,128", help="HQ,HK,D (default olmo3: %(default)s)")
    p.add_argument("--iters", type=int, default=50)
    args = p.parse_args()
    try:
        hq, hk, d = (int(v) for v in args.heads.split(","))
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    except ValueError:
        p.error("--heads is HQ,HK,D and --shapes BxS[,BxS...], all integers")
    if any(len(s) != 2 for s in shapes) or not qw.fits(d):
        p.error(f"shapes must be BxS; head dim {d} must have power-of-two halves")
    if not torch.cuda.is_available():
        sys.exit("error: bench_qk_norm_rope.py needs a CUDA GPU")
    print(
        f"heads {hq}+{hk} x {d}, bf16, fp32 tables; L2 flush: {flush_mode()}; "
        f"auto: {qw.DECODE_HEADS} heads/block up to {qw.DECODE_MAX} tokens, else "
        f"{qw.PREFILL_HEADS}; at most {qw.TOKENS} tokens/block"
    )
    table = []
    for b, s in shapes:
        table += rows(f"{b}x{s}", case(b, s, hq, hk, d), args.iters)
    header = ["shape", "variant", "us", "p10", "p90", "spread%", "vs_3launch", "vs_torch"]
    print(format_table(header, table))


if __name__ == "__main__":
    main()
