"""Where RoPE loses against a copy (H200 diagnostic, not a benchmark of shipped kernels).

Times, interleaved with the op benchmarks' harness (``_timing``; set ``TILEGYM_BENCH_FLUSH``):
a contiguous copy of the q/k bytes; torch copies with RoPE's access pattern (strided q/k read
from the fused QKV output, then written head-major); cuTile kernels with the tiling of the
former "heads" kernel (8 heads x 4 tokens per block) that only copy, or rotate with constant
cos/sin (no cos/sin tile); and the shipped ``apply_rope`` on the QKV views, separate q/k
buffers and head-major inputs. Against the "heads" kernel, the gap to the constant-cos/sin
kernel was what broadcasting the cos/sin tile over heads cost
(docs/results/h200-2026-11-29/ops/rope_experiments.txt); ``apply_rope`` now runs the head-loop
kernel, which has no such broadcast.

Usage (repo root): python3 benchmarks/ops/diag_rope.py [--iters N]
"""

from __future__ import annotations

import argparse
import os
import sys

import cuda.tile as ct
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import flush_mode, interleaved  # noqa: E402

from tilegym.ops import rope as rp  # noqa: E402
from tilegym.ops._common import PAD_ZERO  # noqa: E402

#: (name, batch, seq, q heads, kv heads, head dim) of the cases timed
CASES = (("qwen3", 4, 4096, 16, 8, 128), ("qwen3", 1, 2048, 16, 8, 128))


@ct.function
def _halves_block(x, out, b, h, sb, TH: ct.Constant[int], TS: ct.Constant[int], TR, rotate):
    """Load the two halves of a (1, TH, TS) block as the "heads" kernel did; store them as they
    are or rotated by constant cos = 0.6, sin = 0.8."""
    shape = (1, TH, TS, TR)
    x1 = ct.load(x, (b, h, sb, 0), shape, padding_mode=PAD_ZERO, latency=10).astype(ct.float32)
    x2 = ct.load(x, (b, h, sb, 1), shape, padding_mode=PAD_ZERO, latency=10).astype(ct.float32)
    if rotate:
        x1, x2 = x1 * 0.6 - x2 * 0.8, x2 * 0.6 + x1 * 0.8
    ct.store(out, (b, h, sb, 0), x1.astype(out.dtype), allow_tma=False)
    ct.store(out, (b, h, sb, 1), x2.astype(out.dtype), allow_tma=False)


@ct.kernel(occupancy=6)
def diag_rope_halves_kernel(
    q,
    k,
    q_out,
    k_out,
    TH: ct.Constant[int],
    TS: ct.Constant[int],
    TR: ct.Constant[int],
    ROTATE: ct.Constant[bool],
):
    """The grid and tiles of the former ``rope_heads_kernel`` (q head blocks + k head blocks, token
    tiles, batch) without the cos/sin tile."""
    h = ct.bid(0)
    sb = ct.bid(1)
    b = ct.bid(2)
    nq = ct.cdiv(q.shape[1], TH)
    if h < nq:
        _halves_block(q, q_out, b, h, sb, TH, TS, TR, ROTATE)
    else:
        _halves_block(k, k_out, b, h - nq, sb, TH, TS, TR, ROTATE)


def _halves(q, k, q_out, k_out, rotate: bool, th: int = 8, ts: int = 4) -> None:
    bsz, hq, seq, d = q.shape
    grid = ((hq + th - 1) // th + (k.shape[1] + th - 1) // th, (seq + ts - 1) // ts, bsz)
    args = (q, k, q_out, k_out, th, ts, d // 2, rotate)
    ct.launch(torch.cuda.current_stream(), grid, diag_rope_halves_kernel, args)


def _cos_sin(b, s, d, dt):
    pos = torch.arange(s, device="cuda").float()
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    emb = torch.cat([pos[:, None] * inv] * 2, dim=-1)[None].expand(b, s, d)
    return emb.cos().to(dt).contiguous(), emb.sin().to(dt).contiguous()


def case_fns(b, s, hq, hk, d, dt=torch.bfloat16):
    """{name: callable} of one case, and the q/k bytes read + written."""
    qkv = torch.randn(b, s, (hq + 2 * hk) * d, device="cuda", dtype=dt)
    q_bshd = qkv[..., : hq * d].view(b, s, hq, d)
    k_bshd = qkv[..., hq * d : (hq + hk) * d].view(b, s, hk, d)
    q, k = q_bshd.transpose(1, 2), k_bshd.transpose(1, 2)
    qs = torch.randn(b, s, hq, d, device="cuda", dtype=dt).transpose(1, 2)
    ks = torch.randn(b, s, hk, d, device="cuda", dtype=dt).transpose(1, 2)
    qc, kc = q.contiguous(), k.contiguous()
    qo = torch.empty(b, hq, s, d, device="cuda", dtype=dt)
    ko = torch.empty(b, hk, s, d, device="cuda", dtype=dt)
    strided = torch.empty(b, s, (hq + hk) * d, device="cuda", dtype=dt)
    cos, sin = _cos_sin(b, s, d, dt)
    src = torch.randn(b * s * (hq + hk) * d, device="cuda", dtype=dt)
    dst = torch.empty_like(src)
    fns = {
        "contiguous copy (torch)": lambda: dst.copy_(src),
        "strided q|k copy (torch)": lambda: strided.copy_(qkv[..., : (hq + hk) * d]),
        "to head-major copy (torch)": lambda: (qo.copy_(q), ko.copy_(k)),
        "halves copy (cuTile)": lambda: _halves(q, k, qo, ko, False),
        "halves, constant cos/sin": lambda: _halves(q, k, qo, ko, True),
        "apply_rope (qkv views)": lambda: rp.apply_rope(q, k, cos, sin),
        "apply_rope (separate q, k)": lambda: rp.apply_rope(qs, ks, cos, sin),
        "apply_rope (head-major in)": lambda: rp.apply_rope(qc, kc, cos, sin),
    }
    return fns, 2 * src.numel() * src.element_size()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=40)
    args = p.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, L2 flush: {flush_mode()}")
    for name, b, s, hq, hk, d in CASES:
        fns, nbytes = case_fns(b, s, hq, hk, d)
        for label, st in interleaved(fns, iters=args.iters).items():
            gbs = nbytes / st.median_us / 1e3
            print(
                f"{name} {b}x{s}  {label:28s} {st.median_us:8.1f} us  "
                f"spread {st.spread_pct:5.1f}%  {gbs:6.0f} GB/s"
            )


if __name__ == "__main__":
    main()
