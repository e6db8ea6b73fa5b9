"""cuTile GEMMs vs cuBLAS (torch) for every projection of qwen3 and llama (H200 table), or of
another family's preset (``--models phi3,mistral,...``).

Rows: plain projections (`linear` vs `F.linear`), and the fused forms against the PyTorch ops
they replace: o_proj/down_proj + residual (`linear_residual` vs `r + F.linear`) and
gate-up + SiLU (`fused_gate_up_silu` vs `F.linear` on the packed weight, then `silu(g) * u`).
Timing: `_timing.interleaved_samples` (CUDA events per call, L2 flushed before each call so
weights come from HBM as in a real forward pass, variants interleaved, medians, p10-p90 spread).
A decode GEMM's median moves by 5-10% with where its weight lands in memory, for cuTile and
cuBLAS alike but not together (H200: the same pair's ratio ranged 95-118% over 16 placements,
docs/results/h200-2026-11-30/ops/gemm_gate_up_placements.txt). `--allocs N` times every
variant on N input sets, each allocated after a pad of random size that stays alive (seeded:
`--seed`), so the sets land at different addresses, and pools the samples. Without the pads a
fresh process allocates the same addresses every run: two runs then agree to 0.1 us while
both measure the same few placements.

Modes:
  (default)            the table with the tile table's configs
  --sweep              also time every candidate config; the table uses the best one and
                       --tuned-out writes the tile table in use with the winners per
                       (M bucket, N, K, gated) in place: a whole table for TILEGYM_GEMM_TILES
  --confirm SWEEP_JSON re-time the --top (4) best configs per key of an earlier sweep's
                       --json-out on fresh allocations and pick from this run (the sweep's
                       own pick favours lucky samples); --tuned-out as for --sweep
  --warmup-shard I/N   run shard I of N of all launches once (JIT compile into the disk cache,
                       so parallel processes compile while the timed run only loads)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from collections import defaultdict

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import flush_mode, format_table, interleaved_samples, pooled  # noqa: E402

from tilegym.ops import gemm  # noqa: E402
from tilegym.ops.gemm_configs import (  # noqa: E402
    TileConfig,
    candidate_configs,
    choose_config,
    config_name,
    m_bucket,
    table_doc,
    table_entry,
    table_text,
)

MODELS = {
    "qwen3": dict(
        hidden=1024, q=16 * 128, kv=8 * 128, inter=3072, vocab=151936, head=128, qk_norm=True
    ),
    "llama": dict(hidden=2048, q=32 * 64, kv=8 * 64, inter=8192, vocab=128256, head=64),
    # the other families' presets (their configs under tilegym_hf_bench/configs), --models
    "mistral": dict(hidden=4096, q=32 * 128, kv=8 * 128, inter=14336, vocab=32768, head=128),
    "qwen2": dict(hidden=1536, q=12 * 128, kv=2 * 128, inter=8960, vocab=151936, head=128),
    "phi3": dict(hidden=3072, q=32 * 96, kv=32 * 96, inter=8192, vocab=32064, head=96),
    "gemma3": dict(hidden=1152, q=4 * 256, kv=1 * 256, inter=6912, vocab=262144, head=256),
    "olmo2": dict(hidden=2048, q=16 * 128, kv=16 * 128, inter=8192, vocab=100352, head=128),
    "olmo3": dict(hidden=4096, q=32 * 128, kv=32 * 128, inter=11008, vocab=100278, head=128),
    "smollm3": dict(hidden=2048, q=16 * 128, kv=4 * 128, inter=11008, vocab=128256, head=128),
}
#: models the table is timed on when --models is not given
DEFAULT_MODELS = ("qwen3", "llama")
TOKENS = (1, 8, 16, 2048)
HEADER = [
    "model",
    "proj",
    "M",
    "N",
    "K",
    "cuBLAS_us",
    "spread%",
    "cuTile_us",
    "spread%",
    "TFLOP/s",
    "%cuBLAS",
    "config",
]


def rows_for(model: str) -> list[tuple[str, str, int, int]]:
    """(proj, op, N, K); op: linear | residual | gated (N = intermediate for gated)."""
    c = MODELS[model]
    h, q, kv, i = c["hidden"], c["q"], c["kv"], c["inter"]
    return [
        ("q_proj", "linear", q, h),
        ("k_proj/v_proj", "linear", kv, h),
        ("qkv_proj(packed)", "linear", q + 2 * kv, h),
        ("o_proj", "linear", h, q),
        ("o_proj+residual", "residual", h, q),
        ("gate_proj/up_proj", "linear", i, h),
        ("gate_up(packed)", "linear", 2 * i, h),
        ("gate_up+silu*mul", "gated", i, h),
        ("down_proj", "linear", h, i),
        ("down_proj+residual", "residual", h, i),
        ("lm_head", "linear", c["vocab"], h),
    ]


def make_fns(op: str, m: int, n: int, k: int):
    """(cuBLAS baseline fn, fn(cfg) -> cuTile callable) on fresh random bf16 inputs.

    Every cuTile callable returns its output, so the sweep can check each config's result.
    """
    dt = torch.bfloat16
    x = torch.randn(m, k, device="cuda", dtype=dt)
    rows = 2 * n if op == "gated" else n
    w = torch.randn(rows, k, device="cuda", dtype=dt) / math.sqrt(k)
    out = torch.empty(m, n, device="cuda", dtype=dt)
    if op == "gated":

        def base():
            g, u = F.linear(x, w).chunk(2, dim=-1)
            return F.silu(g) * u

        return base, lambda cfg: lambda: gemm.fused_gate_up_silu(x, w, out=out, config=cfg)
    if op == "residual":
        r = torch.randn(m, n, device="cuda", dtype=dt)
        return (
            lambda: r + F.linear(x, w),
            lambda cfg: lambda: gemm.linear_residual(x, w, r, out=out, config=cfg),
        )
    return lambda: F.linear(x, w), lambda cfg: lambda: gemm.linear(x, w, out=out, config=cfg)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error on the GPU (inf when the output has NaN/inf)."""
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def sweep_candidates(m: int, n: int, k: int, gated: bool) -> list[TileConfig]:
    """Every candidate of a shape (``--sweep``)."""
    return candidate_configs(m, n, k, gated=gated)


def work_items(models, tokens, cands_for=None, projs=None):
    """(model, proj, op, M, N, K, configs) of every row; ``projs``: only those projections.

    ``cands_for(M, N, K, gated)`` lists the configs to time (None or empty: the table's)."""
    for model in models:
        for proj, op, n, k in rows_for(model):
            if projs and proj not in projs:
                continue
            for m in tokens:
                gated = op == "gated"
                cfgs = cands_for(m, n, k, gated) if cands_for else None
                yield model, proj, op, m, n, k, cfgs or [None]


def warmup(models, tokens, cands_for, shard: int, nshards: int, projs=None) -> None:
    """Launch every (shape, config) of this shard once, grouped so compiles spread evenly."""
    items = []
    for _model, _proj, op, m, n, k, cfgs in work_items(models, tokens, cands_for, projs):
        for cfg in cfgs:
            c = cfg or choose_config(m, n, k, gated=op == "gated")
            key = (op, c.tm, c.tn, c.tk, c.latency, c.transpose_tile, gemm.split_mode(c))
            key += (c.ctas, c.occupancy, c.persistent, c.gemv, c.swap)
            items.append((key, (op, m, n, k, cfg)))
    groups = sorted({g for g, _ in items})
    mine = {g for idx, g in enumerate(groups) if idx % nshards == shard}
    for g, (op, m, n, k, cfg) in items:
        if g in mine:
            _, fn = make_fns(op, m, n, k)
            try:
                fn(cfg)()
                torch.cuda.synchronize()
            except Exception as exc:  # reported, and the timed run excludes this config
                print(f"# compile/launch failed {g}: {type(exc).__name__}: {exc}", flush=True)
            del fn
    print(f"warmup shard {shard}/{nshards}: {len(mine)} compile groups done", flush=True)


def pick_tuned(scores) -> dict[str, list]:
    """Per (bucket, N, K, gated): the config with the best geometric-mean time/cuBLAS ratio
    over all rows of that key it was timed on (only configs timed on every such row)."""
    tuned = {}
    for key, per_cfg in scores.items():
        full = {c: v for c, v in per_cfg.items() if len(v) == max(map(len, per_cfg.values()))}
        best = min(full, key=lambda c: math.prod(full[c]) ** (1 / len(full[c])))
        tuned["|".join(map(str, key))] = table_entry(best)
    return tuned


def shortlist(sweep_doc: dict, top: int) -> dict[tuple, list[TileConfig]]:
    """Per (M bucket, N, K, gated): the ``top`` configs of a sweep (its ``--json-out``) by
    geometric-mean time / cuBLAS over the key's rows, among those timed on all of them.

    A sweep's own pick is the best of ~40 noisy medians, which favours a lucky sample (H200:
    one pick went from 119% of cuBLAS in the sweep to 105% re-timed); ``--confirm`` re-times
    these few on fresh allocations and picks from that run instead."""
    ratios: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    rows_per_key: dict[tuple, int] = defaultdict(int)
    configs: dict[tuple, dict[str, TileConfig]] = {}
    for r in sweep_doc["rows"]:
        gated = r["op"] == "gated"
        key = (m_bucket(r["M"]), r["N"], r["K"], gated)
        rows_per_key[key] += 1
        known = configs.setdefault(key, {})
        known.update(
            {config_name(c): c for c in candidate_configs(r["M"], r["N"], r["K"], gated=gated)}
        )
        for name, us, *_ in r.get("candidates", []):
            ratios[key][name].append(us / r["cublas_us"])
    out = {}
    for key, per_cfg in ratios.items():
        full = {
            c: v for c, v in per_cfg.items() if len(v) == rows_per_key[key] and c in configs[key]
        }
        ranked = sorted(full, key=lambda c: math.prod(full[c]) ** (1 / len(full[c])))
        out[key] = [configs[key][c] for c in ranked[:top]]
    return out


def merged_table(table: dict[str, list], winners: dict[str, list]) -> dict[str, list]:
    """The tile table with a sweep's winners in place of (or after) its entries: a whole table
    that can replace `gemm_tiles.json`, though the sweep covered only some buckets."""
    out = dict(table)
    out.update(winners)
    return out


PAD_STEPS = 32
"""Input-set pads are 0..PAD_STEPS-1 times 2 MiB (the allocator's large-segment granule)."""


def placed_sets(op: str, m: int, n: int, k: int, allocs: int, rng: random.Random):
    """``allocs`` input sets of `make_fns`, each but the first after a pad of random size, and
    the pads (keep them alive while the sets are timed): different placements of W."""
    sets, pads = [], []
    for a in range(allocs):
        if a:
            size = rng.randrange(PAD_STEPS) << 21
            pads.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        sets.append(make_fns(op, m, n, k))
    return sets, pads


def bench(
    models, tokens, cands_for, iters: int, on_row=None, projs=None, allocs: int = 1, seed: int = 0
):
    """Time every row (its configs from ``cands_for``, see `work_items`); with ``allocs`` > 1
    each variant runs on that many separately allocated input sets, interleaved, and its
    samples are pooled (`_timing.pooled`); the sets are placed apart by `placed_sets`."""
    rng = random.Random(seed)
    rows, records, records_bad = [], [], []
    scores: dict[tuple, dict[TileConfig, list[float]]] = defaultdict(lambda: defaultdict(list))
    for model, proj, op, m, n, k, cfgs in work_items(models, tokens, cands_for, projs):
        sets, pads = placed_sets(op, m, n, k, allocs, rng)
        base, make = sets[0]
        gated = op == "gated"
        chosen = choose_config(m, n, k, gated=gated)
        cands = [cfg or chosen for cfg in cfgs]
        ref = base().float()
        good = []
        for cfg in cands:
            fn = make(cfg)
            try:
                err = rel_err(fn(), ref)
            except Exception as exc:  # a config that does not compile or launch is skipped
                print(f"# FAILED {model} {proj} M={m} {cfg}: {type(exc).__name__}", flush=True)
                continue
            if err <= 1e-2:
                good.append((cfg, fn))
            else:
                records_bad.append((model, proj, m, cfg, err))
                print(f"# WRONG RESULT {model} {proj} M={m} {cfg}: rel err {err:.2e}", flush=True)
        del ref
        if not good:
            continue
        cands = [cfg for cfg, _ in good]
        fns = {}
        for a, (base_a, make_a) in enumerate(sets):
            fns[f"cublas#{a}"] = base_a
            for i, (cfg, fn) in enumerate(good):
                fns[f"c{i}#{a}"] = fn if a == 0 else make_a(cfg)
        stats = pooled(interleaved_samples(fns, warmup=2, iters=iters))
        del fns, sets, pads
        for idx, cfg in enumerate(cands):
            ratio = stats[f"c{idx}"].median_us / stats["cublas"].median_us
            scores[(m_bucket(m), n, k, gated)][cfg].append(ratio)
        best = min(range(len(cands)), key=lambda i: stats[f"c{i}"].median_us)
        cb, ct_ = stats["cublas"], stats[f"c{best}"]
        flops = 2 * m * k * (2 * n if gated else n)
        cfg = cands[best]
        rec = dict(
            model=model,
            proj=proj,
            op=op,
            M=m,
            N=n,
            K=k,
            cublas_us=cb.median_us,
            cublas_spread_pct=cb.spread_pct,
            cutile_us=ct_.median_us,
            cutile_spread_pct=ct_.spread_pct,
            tflops=flops / ct_.median_us / 1e6,
            pct_of_cublas=100 * cb.median_us / ct_.median_us,
            config=table_entry(cfg),
            table_config=table_entry(chosen),
        )
        if cands_for:  # every correct candidate's time, for reading a sweep beyond its winners
            rec["candidates"] = [
                [config_name(c), stats[f"c{i}"].median_us, stats[f"c{i}"].spread_pct]
                for i, c in enumerate(cands)
            ]
        records.append(rec)
        rows.append(
            [
                model,
                proj,
                m,
                n,
                k,
                cb.median_us,
                cb.spread_pct,
                ct_.median_us,
                ct_.spread_pct,
                rec["tflops"],
                rec["pct_of_cublas"],
                config_name(cfg),
            ]
        )
        print(format_table(HEADER, [rows[-1]]).splitlines()[-1], flush=True)
        if on_row:
            on_row(records, pick_tuned(scores))
    tuned = pick_tuned(scores)
    return rows, records, tuned, records_bad


def summary(records) -> list[str]:
    lines = []
    lin = [r for r in records if r["op"] == "linear"]
    pre = [r for r in lin if r["M"] >= 2048]
    one = [r for r in lin if r["M"] == 1]
    dec = [r for r in lin if 1 < r["M"] <= 16]
    groups = (
        ("prefill", pre, 90.0),
        ("one row (M=1)", one, 100.0),
        ("decode (M 2-16)", dec, 100.0),
    )
    for name, sel, target in groups:
        if sel:
            worst = min(sel, key=lambda r: r["pct_of_cublas"])
            miss = [r for r in sel if r["pct_of_cublas"] < target]
            lines.append(
                f"{name}: {len(sel) - len(miss)}/{len(sel)} rows >= {target:.0f}% of cuBLAS; "
                f"worst {worst['pct_of_cublas']:.1f}% ({worst['model']} {worst['proj']} "
                f"M={worst['M']})"
            )
    fused = [r for r in records if r["op"] != "linear"]
    faster = [r for r in fused if r["pct_of_cublas"] > 100]
    lines.append(f"fused epilogues faster than the torch pair: {len(faster)}/{len(fused)} rows")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS))
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--projs", default="", help="comma-separated projections (default: all)")
    p.add_argument("--sweep", action="store_true")
    p.add_argument(
        "--confirm",
        default=None,
        metavar="SWEEP_JSON",
        help="re-time the --top best configs per key of that sweep (its --json-out) and pick",
    )
    p.add_argument("--top", type=int, default=4, help="configs per key that --confirm re-times")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--allocs", type=int, default=1, help="input allocations pooled per row")
    p.add_argument("--seed", type=int, default=0, help="seed of the pads between allocations")
    p.add_argument("--warmup-shard", default=None, metavar="I/N")
    p.add_argument("--json-out", default=None)
    p.add_argument("--tuned-out", default=None)
    a = p.parse_args(argv)
    models = [m for m in a.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        print(f"error: unknown model(s) {unknown}; known: {list(MODELS)}", file=sys.stderr)
        return 2
    tokens = [int(t) for t in a.tokens.split(",")]
    projs = [x for x in a.projs.split(",") if x]
    known = {proj for m in models for proj, *_ in rows_for(m)}
    if set(projs) - known:
        print(f"error: unknown projection(s) {sorted(set(projs) - known)}", file=sys.stderr)
        return 2
    if a.allocs < 1:
        print(f"error: --allocs {a.allocs} must be >= 1", file=sys.stderr)
        return 2
    if a.top < 1:
        print(f"error: --top {a.top} must be >= 1", file=sys.stderr)
        return 2
    if a.sweep and a.confirm:
        print("error: --sweep and --confirm exclude each other", file=sys.stderr)
        return 2
    cands_for = sweep_candidates if a.sweep else None
    if a.confirm:
        try:
            with open(a.confirm) as f:
                short = shortlist(json.load(f), a.top)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: {a.confirm}: not a bench_gemm sweep JSON ({exc})", file=sys.stderr)
            return 2

        def cands_for(m, n, k, gated):
            return short.get((m_bucket(m), n, k, gated))

    if not torch.cuda.is_available():
        print("error: no CUDA GPU", file=sys.stderr)
        return 1
    if a.warmup_shard:
        i, n = (int(v) for v in a.warmup_shard.split("/"))
        warmup(models, tokens, cands_for, i, n, projs)
        return 0
    props = torch.cuda.get_device_properties(0)
    print(
        f"# {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, "
        f"L2 flush: {flush_mode()}"
    )
    print(format_table(HEADER, []).splitlines()[0], flush=True)

    shipped = table_doc()

    def save(records, tuned):
        """Rewrite the JSON outputs after every row, so a cut-off run keeps what it measured."""
        doc = {"gpu": props.name, "torch": torch.__version__, "flush": flush_mode()}
        doc.update(rows=records, tuned=tuned)
        table = table_text(merged_table(shipped, tuned))
        for path, text in ((a.json_out, json.dumps(doc, indent=1)), (a.tuned_out, table)):
            if path:
                with open(path + ".tmp", "w") as f:
                    f.write(text)
                os.replace(path + ".tmp", path)

    rows, records, tuned, bad = bench(
        models, tokens, cands_for, a.iters, on_row=save, projs=projs, allocs=a.allocs, seed=a.seed
    )
    print()
    print(format_table(HEADER, rows))
    print("\n".join(summary(records)))
    print(f"configs with a wrong result (excluded): {len(bad)}")
    for model, proj, m, cfg, err in bad:
        print(f"  {model} {proj} M={m} {config_name(cfg)}: rel err {err:.2e}")
    save(records, tuned)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
