"""What the benchmarks' L2 flush does to memory-bound timings (H200 diagnostic table).

For a device copy and a decode-shaped cuBLAS GEMV of several sizes, times each call with no
flush (inputs L2-resident when they fit), after the default write flush (the L2 is left full
of dirty lines) and after a read flush (clean lines), interleaved in one loop. The gap between
write and read is the write-back the write flush adds to the timed kernel.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _timing  # noqa: E402
from _timing import format_table, gbps, summarize  # noqa: E402

SIZES_MB = (4, 16, 32, 128)
MODES = ("none", "write", "read")


def _time(fn, mode: str, iters: int) -> list[float]:
    out = []
    for _ in range(iters):
        if mode != "none":
            os.environ["TILEGYM_BENCH_FLUSH"] = mode
            _timing._flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1000.0)
    return out


def main() -> int:
    if not torch.cuda.is_available():
        print("error: no CUDA GPU", file=sys.stderr)
        return 1
    rows = []
    for mb in SIZES_MB:
        n = mb * 1024 * 1024 // 2
        src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        k = 2048
        w = src.view(-1, k)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        ops = {"copy": (lambda d=dst, s=src: d.copy_(s), 2 * src.numel() * 2)}
        ops["gemv M=1"] = (lambda x=x, w=w: F.linear(x, w), src.numel() * 2)
        for name, (fn, nbytes) in ops.items():
            for _ in range(5):
                fn()
            samples = {m: [] for m in MODES}
            for _ in range(10):  # rounds interleave the modes
                for m in MODES:
                    samples[m] += _time(fn, m, 5)
            for m in MODES:
                st = summarize(samples[m])
                rows.append([name, f"{mb} MB", m, st.median_us, st.spread_pct, gbps(nbytes, st)])
    header = ["op", "bytes", "flush", "us", "spread%", "GB/s"]
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(format_table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
