"""Qwen3-MoE experts and router: cuTile (`tilegym.ops.moe`) vs what transformers runs (H200 table).

    python benchmarks/ops/bench_moe.py [--tokens 1,8,2048] [--iters 50] [--sweep] [--stages]
                                       [--json FILE]

Shapes: Qwen3-30B-A3B (hidden 2048, moe_intermediate_size 768, 128 experts, 8 per token), bf16,
routing from random router logits (softmax, top-8, renormalized, as the model's router does).

- experts: `moe.moe_experts` vs `Qwen3MoeExperts.forward` with the experts implementation a
  `Qwen3MoeForCausalLM` gets by default (read from a tiny model's config; the table names it
  and the grouped-GEMM function it reaches), both without the residual. Timed eagerly and as
  CUDA-graph replays (the benchmark's static decode mode captures the decode step).
- floor (decode rows): bytes of the active experts' weights (distinct ids x 3 x H x I x 2 B)
  at the device-to-device copy bandwidth measured here (a 1 GiB copy: 2 GiB moved per call).
- router: `moe.moe_route` vs the PyTorch ops (softmax in fp32, topk, renormalize, cast).
- --sweep: also times other `MoeConfig`s per token count (cuTile only, same interleaving).
- --stages: also times each stage of the default config alone (dispatch, row gather + gate-up
  GEMM, down GEMM, combine), the GEMMs against their share of the weight-read floor; where
  the default is the per-slot dispatch, also its ``direct`` variant (gate-up, down, combine).

Times: medians of CUDA-event timed calls after warm-up, variants interleaved call by call, the
L2 flushed before each call (weights come from HBM, as in a forward pass over 48 layers);
spread = (p90 - p10) / median.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _graph_timing import graphed  # noqa: E402
from _timing import Stats, copy_tbps, format_table, interleaved  # noqa: E402

from tilegym.ops import moe  # noqa: E402
from tilegym.ops.moe import MoeConfig  # noqa: E402

SHAPE = moe.QWEN3_30B_A3B
HEADER = ["op", "T", "mode", "baseline", "base_us", "cutile_us", "spread%", "base_spread%"]
HEADER += ["speedup", "floor_us", "%floor"]

#: configs --sweep times next to the default, by regime
SWEEP = {
    "decode": [
        MoeConfig(8, 64, 64, 128, swap=True, dispatch="sorted", occupancy=2),
        MoeConfig(8, 64, 64, 128, swap=True, dispatch="direct", occupancy=2),
        MoeConfig(8, 64, 64, 128, swap=True, dispatch="direct", occupancy=0),
        MoeConfig(8, 64, 64, 128, swap=True, dispatch="per_slot", occupancy=0),
        MoeConfig(8, 64, 64, 64, swap=True, dispatch="per_slot", occupancy=2),
        MoeConfig(8, 64, 64, 256, swap=True, dispatch="per_slot", occupancy=2),
        MoeConfig(8, 64, 128, 128, swap=True, dispatch="per_slot", occupancy=2),
        MoeConfig(8, 128, 64, 128, swap=True, dispatch="per_slot", occupancy=2),
        MoeConfig(8, 32, 64, 128, swap=True, dispatch="per_slot", occupancy=2),
    ],
    "middle": [
        MoeConfig(16, 64, 64, 128, swap=True, occupancy=2),
        MoeConfig(8, 64, 64, 64, swap=True, occupancy=2),
        MoeConfig(8, 128, 128, 64, swap=True, occupancy=2),
    ],
    "prefill": [
        MoeConfig(64, 128, 128, 64, occupancy=1),
        MoeConfig(64, 128, 64, 64),
        MoeConfig(64, 64, 128, 64),
        MoeConfig(64, 128, 128, 128),
        MoeConfig(128, 128, 128, 64),
        MoeConfig(32, 64, 128, 64, swap=True),
    ],
}


def transformers_default() -> tuple[str, str]:
    """(experts implementation a Qwen3MoeForCausalLM gets by default, what it computes with)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    tiny = Qwen3MoeConfig(
        hidden_size=64,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        vocab_size=128,
    )
    impl = Qwen3MoeForCausalLM(tiny).config._experts_implementation
    if impl == "grouped_mm":
        if hasattr(torch.nn.functional, "grouped_mm"):
            return impl, "torch.nn.functional.grouped_mm"
        if hasattr(torch, "_grouped_mm"):
            return impl, "torch._grouped_mm"
        return impl, "transformers per-expert fallback loop"
    if impl == "batched_mm":
        return impl, "torch.bmm over per-slot expert weights"
    return impl, "per-expert loop (index_add_)"


def experts_module(impl: str, gate_up: torch.Tensor, down: torch.Tensor):
    """`Qwen3MoeExperts` at the model's shapes with ``impl``, sharing ``gate_up``/``down``."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = Qwen3MoeConfig(
        hidden_size=SHAPE["hidden"],
        moe_intermediate_size=SHAPE["inter"],
        num_experts=SHAPE["experts"],
        num_experts_per_tok=SHAPE["top_k"],
    )
    cfg._experts_implementation = impl
    with torch.device("meta"):
        module = Qwen3MoeExperts(cfg)
    module.gate_up_proj = torch.nn.Parameter(gate_up, requires_grad=False)
    module.down_proj = torch.nn.Parameter(down, requires_grad=False)
    return module


def routing(t: int, gen: torch.Generator):
    logits = torch.randn((t, SHAPE["experts"]), generator=gen, device="cuda").to(torch.bfloat16)
    weights, ids = moe.moe_route_reference(logits, SHAPE["top_k"], True)
    return logits, weights, ids


def experts_inputs(t: int, gen: torch.Generator):
    """(gate_up, down, hidden, routing weights, expert ids) at the model's shapes, bf16."""
    h, i, e = SHAPE["hidden"], SHAPE["inter"], SHAPE["experts"]
    gate_up = (torch.randn((e, 2 * i, h), generator=gen, device="cuda") / h**0.5).bfloat16()
    down = (torch.randn((e, h, i), generator=gen, device="cuda") / i**0.5).bfloat16()
    x = torch.randn((t, h), generator=gen, device="cuda").bfloat16()
    _, weights, ids = routing(t, gen)
    return gate_up, down, x, weights, ids


def experts_rows(t, gen, impl, desc, bw, iters, sweep, results):
    h, i = SHAPE["hidden"], SHAPE["inter"]
    gate_up, down, x, weights, ids = experts_inputs(t, gen)
    module = experts_module(impl, gate_up, down)
    ids64 = ids.long()
    active = int(ids.unique().numel())
    floor_us = active * 3 * h * i * 2 / bw * 1e6 if t <= 64 else None

    def torch_fn():
        return module(x, ids64, weights)

    def cutile_fn():
        return moe.moe_experts(x, ids, weights, gate_up, down)

    ref = moe.moe_experts_reference(x, ids, weights, gate_up, down)
    for name, fn in (("torch", torch_fn), ("cutile", cutile_fn)):
        err = (fn().float() - ref).norm() / ref.norm()
        results.setdefault("errors", {})[f"{name}@{t}"] = float(err)
    rows = []
    with torch.no_grad():
        for mode in ("eager", "graph"):
            fns = {"torch": torch_fn, "cutile": cutile_fn}
            if mode == "graph":
                try:
                    fns = {k: graphed(f) for k, f in fns.items()}
                except RuntimeError as exc:  # a baseline that cannot be captured: say so
                    print(f"T={t}: CUDA-graph capture failed: {exc}")
                    continue
            st = interleaved(fns, iters=iters)
            rows.append(_row("experts", t, mode, f"{impl}: {desc}", st, floor_us))
            results.setdefault("experts", []).append(_record(t, mode, st, floor_us, active))
        if sweep:
            regime = "decode" if t <= 8 else "middle" if t <= 256 else "prefill"
            fns = {"default": cutile_fn}
            for cfg in SWEEP[regime]:
                fns[_cfg_name(cfg)] = lambda cfg=cfg: moe.moe_experts(
                    x, ids, weights, gate_up, down, config=cfg
                )
            st = interleaved({k: graphed(f) for k, f in fns.items()}, iters=iters)
            for name, s in st.items():
                pct = f"{100 * floor_us / s.median_us:.0f}" if floor_us else "-"
                rows.append(
                    ["experts", t, "graph", f"sweep {name}", "-", s.median_us, s.spread_pct]
                    + ["-", "-", floor_us if floor_us else "-", pct]
                )
                results.setdefault("sweep", []).append(
                    {"T": t, "config": name, "median_us": s.median_us, "spread": s.spread_pct}
                )
    return rows


def stage_rows(t, gen, bw, iters, results, cfg=None):
    """Each stage of the default config (or ``cfg``) alone (graph replays, interleaved): where a
    call's time goes. The GEMM rows' %floor is their share of the weights (2/3 and 1/3) at copy
    bandwidth."""
    h, i, e, k = SHAPE["hidden"], SHAPE["inter"], SHAPE["experts"], SHAPE["top_k"]
    gate_up, down, x, weights, ids = experts_inputs(t, gen)
    cfg = cfg or moe.choose_config(t * k, e)
    flat = ids.reshape(-1).contiguous()
    out = torch.empty_like(x)
    if cfg.dispatch == "direct":
        rows = t * k * cfg.bm
        act, y = x.new_empty((rows, i)), x.new_empty((rows, h))
        fns = {
            "gate_up": lambda: moe.direct_gate_up_silu(x, flat, gate_up, k, cfg, act),
            "down": lambda: moe.grouped_down(act, flat, down, cfg, y),
            "combine": lambda: moe.combine(y, ids, weights, None, out, e, cfg.bm),
        }
    else:
        sorted_, pos, bexp = moe.moe_dispatch(flat, e, cfg.bm, cfg.dispatch)
        act = x.new_empty((sorted_.numel(), i))
        y = x.new_empty((sorted_.numel(), h))
        fns = {
            "dispatch": lambda: moe.moe_dispatch(flat, e, cfg.bm, cfg.dispatch),
            "gather+gate_up": lambda: moe.grouped_gate_up_silu(
                x, sorted_, bexp, gate_up, k, cfg, act
            ),
            "down": lambda: moe.grouped_down(act, bexp, down, cfg, y),
            "combine": lambda: moe.combine(y, pos.view(t, k), weights, None, out),
        }
    fns["all"] = lambda: moe.moe_experts(x, ids, weights, gate_up, down, config=cfg)
    active = int(ids.unique().numel())
    share = {"gather+gate_up": 2 / 3, "gate_up": 2 / 3, "down": 1 / 3, "all": 1.0}
    rows = []
    with torch.no_grad():
        st = interleaved({n: graphed(f) for n, f in fns.items()}, iters=iters)
    for name, s in st.items():
        floor_us = share[name] * active * 3 * h * i * 2 / bw * 1e6 if name in share else None
        pct = f"{100 * floor_us / s.median_us:.0f}" if floor_us else "-"
        rows.append(
            [f"stage {name}", t, "graph", _cfg_name(cfg), "-", s.median_us, s.spread_pct]
            + ["-", "-", floor_us if floor_us else "-", pct]
        )
        results.setdefault("stages", []).append(
            {
                "T": t,
                "config": _cfg_name(cfg),
                "stage": name,
                "median_us": s.median_us,
                "spread": s.spread_pct,
            }
        )
    return rows


def route_rows(t, gen, iters, results):
    logits, _, _ = routing(t, gen)
    k = SHAPE["top_k"]
    fns = {
        "torch": lambda: moe.moe_route_reference(logits, k, True),
        "cutile": lambda: moe.moe_route(logits, k, True),
    }
    rows = []
    for mode in ("eager", "graph"):
        run = fns if mode == "eager" else {n: graphed(f) for n, f in fns.items()}
        st = interleaved(run, iters=iters)
        rows.append(_row("router", t, mode, "softmax+topk+renorm", st, None))
        results.setdefault("router", []).append(_record(t, mode, st, None, None))
    return rows


def _cfg_name(c: MoeConfig) -> str:
    flags = ("swap " if c.swap else "") + f"{c.dispatch} occ{c.occupancy}"
    return f"{c.bm}x{c.bn_up}x{c.bn_down} tk{c.tk} {flags}"


def _row(op, t, mode, baseline, st: dict[str, Stats], floor_us):
    b, c = st["torch"], st["cutile"]
    pct = f"{100 * floor_us / c.median_us:.0f}" if floor_us else "-"
    return [op, t, mode, baseline, b.median_us, c.median_us, c.spread_pct, b.spread_pct] + [
        f"{b.median_us / c.median_us:.2f}x",
        floor_us if floor_us else "-",
        pct,
    ]


def _record(t, mode, st, floor_us, active):
    return {
        "T": t,
        "mode": mode,
        "torch_us": st["torch"].median_us,
        "cutile_us": st["cutile"].median_us,
        "torch_spread": st["torch"].spread_pct,
        "cutile_spread": st["cutile"].spread_pct,
        "floor_us": floor_us,
        "active_experts": active,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="1,8,2048", help="token counts (comma separated)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep", action="store_true", help="also time other MoeConfigs")
    ap.add_argument("--stages", action="store_true", help="also time each stage alone")
    ap.add_argument("--json", help="write the numbers here too")
    args = ap.parse_args()
    try:
        tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        ap.error(f"--tokens {args.tokens!r}: comma-separated token counts, e.g. 1,8,2048")
    if min(tokens) < 1 or args.iters < 1:
        ap.error("--tokens and --iters must be positive")
    if not torch.cuda.is_available():
        sys.exit("error: bench_moe times CUDA kernels; no CUDA GPU here")
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    impl, desc = transformers_default()
    bw = copy_tbps() * 1e12
    results: dict = {"transformers_experts": impl, "computes_with": desc, "copy_GBps": bw / 1e9}
    print(f"transformers default experts implementation: {impl!r} -> {desc}")
    print(f"device-to-device copy: {bw / 1e9:.0f} GB/s (read + write bytes per second)")
    rows = []
    for t in tokens:
        rows += experts_rows(t, gen, impl, desc, bw, args.iters, args.sweep, results)
        torch.cuda.empty_cache()  # the previous row's weights and graphs are gone
        if args.stages:
            rows += stage_rows(t, gen, bw, args.iters, results)
            default = moe.choose_config(t * SHAPE["top_k"], SHAPE["experts"])
            if default.dispatch == "per_slot":  # and its direct variant
                direct = dataclasses.replace(default, dispatch="direct")
                rows += stage_rows(t, gen, bw, args.iters, results, direct)
            torch.cuda.empty_cache()
    for t in tokens:
        rows += route_rows(t, gen, args.iters, results)
    print(format_table(HEADER, rows))
    print("relative error vs fp32:", {k: f"{v:.2e}" for k, v in results["errors"].items()})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
