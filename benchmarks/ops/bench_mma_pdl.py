"""The mma GEMM kernels under each mode of programmatic dependent launch (``gemm.MMA_PDL``), in
a decode-like chain of whole layers' projections: LAYERS x (RMSNorm -> QKV -> o_proj + residual
-> RMSNorm -> fused gate/up -> down_proj + residual), each layer its own weights (so weights
stream from HBM), at a model's widths, for one row (decode at batch 1) and eight. Each
projection takes the tile the table gives its shape; a shape whose tile is a GEMV is not
touched by ``MMA_PDL`` (the GEMV has ``GEMV_PDL``, on in every variant). One CUDA graph per
variant, captured with the constant set; the graphs replay in turn (``_graph_timing``);
medians of ``--replays`` replays with the min-max range, microseconds per layer, the weights'
read rate, and whether each variant's output equals the "off" one bit for bit (it must: the
same products run, only the launches differ).

    python benchmarks/ops/bench_mma_pdl.py [--models olmo3 llama qwen3] [--rows 1 8]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _graph_timing import interleaved_graphs  # noqa: E402
from _timing import format_table  # noqa: E402

from tilegym.ops import gemm  # noqa: E402
from tilegym.ops.gemm_configs import choose_config  # noqa: E402
from tilegym.ops.rms_norm import rms_norm  # noqa: E402

#: model -> (hidden, q + k + v width, intermediate, layers in the chain)
MODELS = {
    "olmo3": (4096, 3 * 4096, 11008, 6),
    "llama": (2048, 2048 + 2 * 512, 8192, 16),
    "qwen3": (1024, 2048 + 2 * 1024, 3072, 28),
}


def _weights(shape, layers: int, gen: torch.Generator) -> list[torch.Tensor]:
    k = shape[1]
    return [
        (torch.randn(*shape, device="cuda", generator=gen) / k**0.5).bfloat16()
        for _ in range(layers)
    ]


def chain(model: str, rows: int, gen: torch.Generator):
    """A function of a mode running the chain with ``MMA_PDL`` set to it, its output tensor,
    and the bytes of weight one run reads."""
    hidden, qkv, inter, layers = MODELS[model]
    w_qkv = _weights((qkv, hidden), layers, gen)
    w_o = _weights((hidden, hidden), layers, gen)
    w_gu = _weights((2 * inter, hidden), layers, gen)
    w_down = _weights((hidden, inter), layers, gen)
    nw = (torch.rand(hidden, device="cuda", generator=gen) + 0.5).bfloat16()
    h0 = torch.randn(rows, hidden, device="cuda", generator=gen).bfloat16()
    out = torch.empty_like(h0)
    nbytes = sum(w.numel() * 2 for ws in (w_qkv, w_o, w_gu, w_down) for w in ws)

    def make(mode: str):
        def run():
            saved, gemm.MMA_PDL = gemm.MMA_PDL, mode
            try:
                h = h0
                for i in range(layers):
                    q = gemm.linear(rms_norm(h, nw, 1e-6), w_qkv[i])
                    h = gemm.linear_residual(q[:, :hidden], w_o[i], h)
                    act = gemm.fused_gate_up_silu(rms_norm(h, nw, 1e-6), w_gu[i])
                    h = gemm.linear_residual(act, w_down[i], h)
                out.copy_(h)
            finally:
                gemm.MMA_PDL = saved

        return run

    return make, out, nbytes


def tiles(model: str, rows: int) -> str:
    """Which projections of the chain run an mma tile (the ones ``MMA_PDL`` changes)."""
    hidden, qkv, inter, _ = MODELS[model]
    shapes = {"qkv": (qkv, hidden, False), "o": (hidden, hidden, False)}
    shapes |= {"gate_up": (inter, hidden, True), "down": (hidden, inter, False)}
    mma = [
        name for name, (n, k, g) in shapes.items() if not choose_config(rows, n, k, gated=g).gemv
    ]
    return ",".join(mma) or "none"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--replays", type=int, default=30)
    args = ap.parse_args()
    print(torch.cuda.get_device_name())
    rows_out = []
    for model in args.models:
        for rows in args.rows:
            gen = torch.Generator(device="cuda").manual_seed(0)
            make, out, nbytes = chain(model, rows, gen)
            results = {}
            fns = {mode: make(mode) for mode in gemm.MMA_PDL_MODES}
            times = interleaved_graphs(fns, calls=1, replays=args.replays)
            for mode, fn in fns.items():
                fn()
                torch.cuda.synchronize()
                results[mode] = out.clone()
            layers = MODELS[model][3]
            base = times["off"][0]
            for mode, (med, lo, hi) in times.items():
                rows_out.append(
                    [
                        model,
                        rows,
                        tiles(model, rows),
                        mode,
                        f"{med / layers:.2f}",
                        f"{lo / layers:.2f}-{hi / layers:.2f}",
                        f"{base / med:.3f}",
                        f"{nbytes / med / 1e6:.2f}",
                        torch.equal(results[mode], results["off"]),
                    ]
                )
            del make, fns
            torch.cuda.empty_cache()
    header = ["model", "M", "mma projections", "MMA_PDL", "us/layer", "range", "speedup"]
    print(format_table([*header, "W TB/s", "equal"], rows_out))


if __name__ == "__main__":
    main()
