"""gpt-oss experts at decode: cuTile vs their weight-read floor and transformers' default.

    python benchmarks/ops/bench_moe_bias.py [--tokens 1,8] [--iters 50] [--tbps TB/s]
        [--json FILE] [--warm-only]

Shapes are gpt-oss-20b's (hidden 2880, expert width 2880, 32 experts, 4 per token), bf16;
routing is gpt-oss's router on random logits (top-4, softmax over the four).

- ``cutile``: ``tilegym.ops.moe_bias.moe_experts_bias`` on the weights relaid once into the
  kernels' row layout (``expert_rows``), what the patched model runs (here without the
  residual epilogue).
- ``torch``: ``GptOssExperts.forward`` with the experts implementation a
  ``GptOssForCausalLM`` gets by default (read from a tiny model's config and named in the
  output), on the same weights in gpt-oss's own layout.
- floor: the bytes of the routed experts' weights and biases (``expert_bytes`` per distinct
  expert: gate/up ``H x 2I``, down ``I x H``, both biases; 2 bytes each) at ``--tbps`` (by
  default the running GPU's spec HBM bandwidth, ``_timing.hbm_tbps``: H200 4.8, H100 3.35),
  the least time any kernel that reads them once can take.
  ``x floor`` is the cuTile time over it; the issue asks for 2x or less at T = 1.

Both sides are timed eagerly and as CUDA-graph replays (the benchmark's static decode mode
captures the decode step), interleaved call by call, the L2 flushed before each call (the
weights come from HBM, as in a forward pass; ``TILEGYM_BENCH_FLUSH=read`` leaves clean lines,
as a model's previous kernels mostly do, where the default write flush leaves dirty ones the
timed kernel writes back; DESIGN: qwen3_moe's experts were 2.3x their copy-bandwidth floor
after a write flush, 1.69x inside the model);
medians after warm-up, spread = (p90 - p10) / median. Each side's output is checked against
the fp32 reference first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _graph_timing import graphed  # noqa: E402
from _timing import Stats, flush_mode, format_table, interleaved, running_gpu_tbps  # noqa: E402

SHAPE = {"hidden": 2880, "inter": 2880, "experts": 32, "top_k": 4}  # gpt-oss-20b
FLOOR_GOAL = 2.0  # issue 46: the experts at T = 1 within 2x of their weight-read floor
MAX_ERR = 2e-2
HEADER = ["T", "mode", "experts", "torch", "torch us", "cutile us", "spread %", "torch spread %"]
HEADER += ["speedup", "floor us", "x floor", "err"]


def expert_bytes(hidden: int, inter: int, elem: int = 2) -> int:
    """Bytes of one gpt-oss expert's parameters: gate/up ``H x 2I`` and its bias ``2I``, down
    ``I x H`` and its bias ``H``."""
    return (hidden * 2 * inter + 2 * inter + inter * hidden + hidden) * elem


def floor_us(active: int, hidden: int, inter: int, tbps: float, elem: int = 2) -> float:
    """Microseconds to read ``active`` experts' parameters once at ``tbps`` TB/s."""
    return active * expert_bytes(hidden, inter, elem) / (tbps * 1e12) * 1e6


def route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss's router after its linear: top-k logits, softmax over them -> (weights, ids)."""
    top, ids = torch.topk(logits, top_k, dim=-1)
    return torch.softmax(top, dim=-1, dtype=top.dtype), ids


def transformers_default() -> tuple[str, str]:
    """(the experts implementation a GptOssForCausalLM gets by default, what it computes with)."""
    from transformers import GptOssConfig, GptOssForCausalLM

    tiny = GptOssConfig(
        hidden_size=64,
        intermediate_size=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        vocab_size=128,
        layer_types=["full_attention"],
    )
    impl = getattr(GptOssForCausalLM(tiny).config, "_experts_implementation", None) or "eager"
    if impl == "grouped_mm":
        grouped = getattr(torch.nn.functional, "grouped_mm", None) or getattr(
            torch, "_grouped_mm", None
        )
        return impl, "torch grouped GEMM" if grouped else "transformers per-expert fallback loop"
    if impl == "batched_mm":
        return impl, "torch.bmm over per-slot expert weights"
    return impl, "per-expert loop (index_add_)"


def experts_module(impl: str, gate_up, gate_up_bias, down, down_bias):
    """``GptOssExperts`` with ``impl`` on the given parameters (gpt-oss's layout: gate_up
    ``[E, H, 2I]`` interleaved, down ``[E, I, H]``), shared, not copied."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    e, h, i2 = gate_up.shape
    cfg = GptOssConfig(hidden_size=h, intermediate_size=i2 // 2, num_local_experts=e)
    cfg._experts_implementation = impl
    with torch.device("meta"):
        module = GptOssExperts(cfg)
    for name, value in (
        ("gate_up_proj", gate_up),
        ("gate_up_proj_bias", gate_up_bias),
        ("down_proj", down),
        ("down_proj_bias", down_bias),
    ):
        setattr(module, name, torch.nn.Parameter(value, requires_grad=False))
    return module


def experts_inputs(t: int, shape: dict, device, dtype, gen):
    """(x, gate_up, gate_up_bias, down, down_bias, weights, ids) in gpt-oss's layout: weights
    scaled so the activations stay O(1), biases that move the clamp, gpt-oss's routing."""
    h, i, e, k = shape["hidden"], shape["inter"], shape["experts"], shape["top_k"]

    def rand(*s, scale=1.0):
        return (torch.randn(*s, generator=gen, device=device) * scale).to(dtype)

    x = rand(t, h)
    gate_up, gate_up_bias = rand(e, h, 2 * i, scale=3 * h**-0.5), rand(e, 2 * i, scale=2.0)
    down, down_bias = rand(e, i, h, scale=i**-0.5), rand(e, h, scale=0.5)
    weights, ids = route(rand(t, e), k)
    return x, gate_up, gate_up_bias, down, down_bias, weights, ids


def table_row(t, mode, active, impl, stats: dict[str, Stats], floor: float, err: float):
    """One table row and its JSON record."""
    b, c = stats["torch"], stats["cutile"]
    ratio = c.median_us / floor
    row = [t, mode, active, impl, b.median_us, c.median_us, c.spread_pct, b.spread_pct]
    row += [f"{b.median_us / c.median_us:.2f}x", floor, f"{ratio:.2f}x"]
    row += [f"{err:.1e}" + ("" if err <= MAX_ERR else " FAIL")]
    record = {
        "T": t,
        "mode": mode,
        "active_experts": active,
        "torch_us": b.median_us,
        "cutile_us": c.median_us,
        "torch_spread": b.spread_pct,
        "cutile_spread": c.spread_pct,
        "floor_us": floor,
        "x_floor": ratio,
        "err": err,
    }
    return row, record


def rows_for(t, impl, tbps, iters, gen, warm_only):
    from tilegym.ops import moe_bias

    x, gu, gub, down, db, weights, ids = experts_inputs(t, SHAPE, "cuda", torch.bfloat16, gen)
    rows_w = moe_bias.expert_rows(gu, gub, down, db)
    ids32 = ids.to(torch.int32)
    module = experts_module(impl, gu, gub, down, db)
    fns = {
        "torch": lambda: module(x, ids, weights),
        "cutile": lambda: moe_bias.moe_experts_bias(x, ids32, weights, *rows_w),
    }
    ref = moe_bias.moe_experts_bias_reference(
        x.float(), ids32, weights.float(), *(w.float() for w in rows_w)
    )
    with torch.no_grad():
        err = max(float((fn().float() - ref).norm() / ref.norm()) for fn in fns.values())
    if warm_only:
        return [], []
    active = int(ids.unique().numel())
    floor = floor_us(active, SHAPE["hidden"], SHAPE["inter"], tbps)
    rows, records = [], []
    with torch.no_grad():
        for mode in ("eager", "graph"):
            run = fns
            if mode == "graph":
                try:
                    run = {k: graphed(f) for k, f in fns.items()}
                except RuntimeError as exc:  # a baseline that cannot be captured: say so
                    print(f"T={t}: CUDA-graph capture failed: {exc}", flush=True)
                    continue
            row, record = table_row(
                t, mode, active, impl, interleaved(run, iters=iters), floor, err
            )
            rows.append(row)
            records.append(record)
    return rows, records


def _positive_ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated positive integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated positive integers")
    return values


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a positive number")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=_positive_ints, default=[1, 8], help="token counts")
    ap.add_argument("--iters", type=_positive_ints, default=[50], help="timed calls a side")
    ap.add_argument("--tbps", type=_positive_float, help="HBM TB/s (default: the GPU's spec)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--warm-only", action="store_true", help="run both sides once, no table")
    args = ap.parse_args(argv)
    if len(args.iters) != 1:
        ap.error("--iters takes one positive integer")
    args.iters = args.iters[0]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("error: bench_moe_bias times CUDA kernels; no CUDA GPU here", file=sys.stderr)
        return 1
    gpu = torch.cuda.get_device_name()
    if args.tbps is None:
        try:
            args.tbps, _ = running_gpu_tbps()
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    impl, desc = transformers_default()
    print(f"transformers default experts implementation: {impl!r} -> {desc}", flush=True)
    floor = f"routed experts' bytes at {args.tbps} TB/s ({gpu})"
    print(f"floor: {floor}; L2 flush: {flush_mode()}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    rows, records = [], []
    for t in args.tokens:
        r, rec = rows_for(t, impl, args.tbps, args.iters, gen, args.warm_only)
        rows += r
        records += rec
        torch.cuda.empty_cache()
    if args.warm_only:
        print("warm: both sides ran once")
        return 0
    print(format_table(HEADER, rows), flush=True)
    for rec in records:
        if rec["T"] == 1 and rec["mode"] == "graph":
            verdict = "within" if rec["x_floor"] <= FLOOR_GOAL else "NOT within"
            print(f"T=1 (graph): {rec['x_floor']:.2f}x the floor, {verdict} {FLOOR_GOAL}x")
    if args.json:
        out = {"transformers_experts": impl, "computes_with": desc, "gpu": gpu, "tbps": args.tbps}
        with open(args.json, "w") as fh:
            json.dump({**out, "records": records}, fh, indent=1)
    return 1 if any(r["err"] > MAX_ERR for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
