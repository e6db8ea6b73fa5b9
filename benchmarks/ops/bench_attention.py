"""Attention and KV-cache kernels vs PyTorch on the GPU: prefill, decode, cache update tables.

    python benchmarks/ops/bench_attention.py [--json FILE] [--sweep] [--warm-only]
        [--only floor|prefill|decode|cache ...] [--models qwen3,llama]

- floor: trivial launches (a 1-element torch op, empty cuTile kernels, a PDL pair, SDPA and
  the cuTile decode over 16 keys) timed the same way: the fixed cost every row pays.

- prefill: causal GQA flash attention at 2K and 8K tokens, qwen3 (16/8 heads, d=128) and llama
  (32/8, d=64) heads, vs ``torch.nn.functional.scaled_dot_product_attention(enable_gqa=True,
  is_causal=True)`` (flash/cuDNN on H200); ``--sweep`` also times other tile shapes.
- decode: one token over caches of 256..8K at batch 1 and 8 vs SDPA with ``enable_gqa``;
  ``--sweep`` also times the decode variants (``DECODE_VARIANTS``: launch scheme and split plan)
  and names the fastest per row. ``--only decode --models qwen3`` narrows the run.
- cache update: the cuTile write of one decode token (and a 128-token chunk) into a preallocated
  cache vs the ``torch.cat`` of keys and values that ``DynamicCache`` does per layer and step.

Times are medians of CUDA-event timed calls with the L2 flushed before each call, variants
interleaved; spread = (p90 - p10) / median.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys

import cuda.tile as ct
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import Stats, format_table, interleaved, pct_of_copy  # noqa: E402

from tilegym.ops._common import stream  # noqa: E402
from tilegym.ops.attention import (  # noqa: E402
    PrefillConfig,
    decode_attention,
    default_prefill_config,
    prefill_attention,
)
from tilegym.ops.kv_cache import kv_cache_write  # noqa: E402

HEADS = {"qwen3": (16, 8, 128), "llama": (32, 8, 64), "olmo3": (32, 32, 128)}
SWEEP = [
    PrefillConfig(128, 128, 2),
    PrefillConfig(128, 64, 2),
    PrefillConfig(64, 64, 2),
    PrefillConfig(64, 128, 2),
    PrefillConfig(64, 64, 3),
    PrefillConfig(128, 128, 3),
]
DECODE_VARIANTS = {
    # name: decode_attention keyword arguments ("tile" = the library default is always timed)
    "pdl": dict(mode="pdl"),  # the default before the "auto" plan (issue 5)
    "pdl o2 w2": dict(mode="pdl", split_waves=2, occupancy=2),
    # more, shorter splits: batch 1 at 2K keys gives a split 5 tiles (olmo3's 32 heads)
    "pdl o2 w4": dict(mode="pdl", split_waves=4, occupancy=2),
    "pdl o3 w3": dict(mode="pdl", split_waves=3, occupancy=3),
    "pdl o4 w4": dict(mode="pdl", split_waves=4, occupancy=4),
    "one": dict(num_splits=1),
    "one n256": dict(num_splits=1, tile_n=256),
    "rows auto": dict(mode="auto", form="rows"),
    "rows pdl": dict(mode="pdl", form="rows"),
    "rows one": dict(num_splits=1, form="rows"),
}
"""Decode variants timed against SDPA (interleaved): launch scheme (``pdl`` split + reduction),
split plan (w=waves, o=occupancy hint), one split with an n-key tile, and the ``rows`` MMA
orientation."""


def decode_variants(d: int) -> dict[str, dict]:
    """DECODE_VARIANTS (the same set at either head dim)."""
    return dict(DECODE_VARIANTS)


@ct.kernel
def _noop_kernel(X, PDL: ct.Constant[bool]):
    """Harness floor: each block writes one float (with ``PDL``, after the grid dependency)."""
    if PDL:
        ct.grid_dependency_control_wait()
    ct.store(X, index=(ct.bid(0),), tile=ct.full((1,), 1.0, dtype=ct.float32))


def _noop(x, blocks: int, pdl: bool = False):
    ct.launch(stream(), (blocks, 1, 1), _noop_kernel, (x, pdl), programmatic_dependent_launch=pdl)


def _two_noops(x, pdl: bool):
    _noop(x, 128)
    _noop(x, 128, pdl)


def sdpa(q, k, v, causal):
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=causal, enable_gqa=True
    )


def _cat_kv(past_k, past_v, k_new, v_new):
    """What DynamicCache does per layer and step."""
    return torch.cat([past_k, k_new], dim=-2), torch.cat([past_v, v_new], dim=-2)


def _rand(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


PREFILL_HEADER = [
    "model",
    "batch",
    "seq",
    "variant",
    "median us",
    "spread %",
    "TFLOP/s",
    "% of sdpa",
]
DECODE_HEADER = [
    "model",
    "batch",
    "cache",
    "sdpa us",
    "tile us",
    "spread %",
    "tile GB/s",
    "% copy",
    "speedup",
    "best",
    "best us",
    "best speedup",
    "variants us (w=waves, k=min keys/split, o=occupancy, n=tile_n)",
]
FLOOR_HEADER = ["what", "median us", "p10 us", "p90 us"]
CACHE_HEADER = ["batch", "past", "new", "torch.cat us", "tile us", "spread %", "speedup"]


def prefill_table_rows(model: str, b: int, s: int, hq: int, d: int, stats: dict[str, Stats]):
    """Table rows and JSON records of one prefill shape (pure: plain Stats in, lists out)."""
    flops = 4 * b * hq * s * s * d / 2
    base = stats["sdpa"].median_us
    rows, records = [], []
    for name, st in stats.items():
        tflops = flops / (st.median_us * 1e-6) / 1e12
        rows.append(
            [model, b, s, name, st.median_us, st.spread_pct, tflops, 100 * base / st.median_us]
        )
        records.append(
            dict(
                kind="prefill",
                model=model,
                batch=b,
                seq=s,
                variant=name,
                median_us=st.median_us,
                p10_us=st.p10_us,
                p90_us=st.p90_us,
                tflops=tflops,
            )
        )
    return rows, records


def decode_table_row(
    model: str, b: int, n: int, nbytes: int, stats: dict[str, Stats], ceiling_tbps=None
):
    """Table row and JSON record of one decode shape; extra variants go to the sweep column.
    ``ceiling_tbps``: the copy ceiling of the "% of copy" column (default: measured here)."""
    t, s = stats["tile"], stats["sdpa"]
    extra = {k: v.median_us for k, v in stats.items() if k not in ("tile", "sdpa")}
    best = min((k for k in stats if k != "sdpa"), key=lambda k: stats[k].median_us)
    row = [
        model,
        b,
        n,
        s.median_us,
        t.median_us,
        t.spread_pct,
        nbytes / (t.median_us * 1e-6) / 1e9,
        pct_of_copy(nbytes, t, ceiling_tbps),
        f"{s.median_us / t.median_us:.2f}x",
        best,
        stats[best].median_us,
        f"{s.median_us / stats[best].median_us:.2f}x",
        " ".join(f"{k}:{v:.1f}" for k, v in extra.items()) or "-",
    ]
    record = dict(
        kind="decode",
        model=model,
        batch=b,
        cache=n,
        sdpa_us=s.median_us,
        tile_us=t.median_us,
        tile_p10_us=t.p10_us,
        tile_p90_us=t.p90_us,
        sweep_us=extra,
    )
    return row, record


def cache_table_row(b: int, n: int, s_new: int, stats: dict[str, Stats]):
    c, t = stats["torch.cat"], stats["tile write"]
    row = [b, n, s_new, c.median_us, t.median_us, t.spread_pct, c.median_us / t.median_us]
    record = dict(
        kind="cache_update", batch=b, past=n, new=s_new, cat_us=c.median_us, tile_us=t.median_us
    )
    return row, record


def prefill_rows(seqs, sweep: bool, iters: int, warm_only: bool):
    rows, records = [], []
    for model, (hq, hkv, d) in HEADS.items():
        for s in seqs:
            b = max(1, 8192 // s)
            q, k, v = _rand(b, hq, s, d), _rand(b, hkv, s, d), _rand(b, hkv, s, d)
            cfgs = [default_prefill_config(d)]
            if sweep:
                cfgs += [c for c in SWEEP if c != cfgs[0]]
            fns = {"sdpa": functools.partial(sdpa, q, k, v, True)}
            for c in cfgs:
                name = f"tile {c.tile_m}x{c.tile_n} o{c.occupancy}"
                fns[name] = functools.partial(prefill_attention, q, k, v, config=c)
            if warm_only:
                for fn in fns.values():
                    fn()
                continue
            r, rec = prefill_table_rows(model, b, s, hq, d, interleaved(fns, warmup=3, iters=iters))
            rows += r
            records += rec
    return format_table(PREFILL_HEADER, rows), records


def decode_rows(lengths, batches, iters: int, warm_only: bool, sweep: bool, models=tuple(HEADS)):
    rows, records = [], []
    for model, (hq, hkv, d) in HEADS.items():
        if model not in models:
            continue
        for b in batches:
            for n in lengths:
                q = _rand(b, hq, 1, d)
                k, v = _rand(b, hkv, n, d), _rand(b, hkv, n, d)
                fns = {
                    "sdpa": functools.partial(sdpa, q, k, v, False),
                    "tile": functools.partial(decode_attention, q, k, v),
                }
                for name, kw in decode_variants(d).items() if sweep else ():
                    fns[name] = functools.partial(decode_attention, q, k, v, **kw)
                if warm_only:
                    for fn in fns.values():
                        fn()
                    continue
                nbytes = 2 * k.numel() * k.element_size()
                row, rec = decode_table_row(
                    model, b, n, nbytes, interleaved(fns, warmup=5, iters=iters)
                )
                rows.append(row)
                records.append(rec)
    table = format_table(DECODE_HEADER, rows)
    if records and any(r["sweep_us"] for r in records):
        table += "\n\n## decode variants vs sdpa over all rows\n" + decode_summary(records)
    return table, records


SUMMARY_HEADER = ["variant", "rows >= sdpa", "geomean x", "worst x", "worst row", "best in"]


def decode_summary(records: list[dict]) -> str:
    """Per variant ("tile" = the library default): rows at least as fast as SDPA, geometric mean
    and worst speedup over SDPA, and in how many rows it was the fastest variant (pure)."""
    names = ["tile", *dict.fromkeys(k for r in records for k in r["sweep_us"])]
    times = [{"tile": r["tile_us"], **r["sweep_us"]} for r in records]
    wins = {n: 0 for n in names}
    for t in times:
        wins[min(t, key=t.get)] += 1
    rows = []
    for n in names:
        ratios = [
            (r["sdpa_us"] / t[n], f"{r['model']} b{r['batch']} c{r['cache']}")
            for r, t in zip(records, times, strict=True)
            if n in t
        ]
        geo = math.exp(sum(math.log(x) for x, _ in ratios) / len(ratios))
        worst = min(ratios)
        ok = sum(x >= 1.0 for x, _ in ratios)
        rows.append([n, f"{ok}/{len(ratios)}", f"{geo:.3f}", f"{worst[0]:.2f}", worst[1], wins[n]])
    return format_table(SUMMARY_HEADER, rows)


def floor_fns() -> dict:
    """Trivial launches timed like the decode rows: how close a kernel can get to zero here."""
    x = torch.zeros(1024, device="cuda", dtype=torch.float32)
    hq, hkv, d = HEADS["qwen3"]
    q, k, v = _rand(1, hq, 1, d), _rand(1, hkv, 16, d), _rand(1, hkv, 16, d)
    return {
        "torch add_ (1 element)": functools.partial(x[:1].add_, 1.0),
        "cuTile noop, 1 block": functools.partial(_noop, x, 1),
        "cuTile noop, 128 blocks": functools.partial(_noop, x, 128),
        "2 cuTile noops": functools.partial(_two_noops, x, False),
        "2 cuTile noops, 2nd PDL": functools.partial(_two_noops, x, True),
        "sdpa qwen3 b1 c16": functools.partial(sdpa, q, k, v, False),
        "tile decode qwen3 b1 c16": functools.partial(decode_attention, q, k, v),
    }


def floor_rows(iters: int, warm_only: bool):
    fns = floor_fns()
    if warm_only:
        for fn in fns.values():
            fn()
        return "", []
    stats = interleaved(fns, warmup=5, iters=iters)
    rows = [[k, st.median_us, st.p10_us, st.p90_us] for k, st in stats.items()]
    records = [dict(kind="floor", what=k, median_us=st.median_us) for k, st in stats.items()]
    return format_table(FLOOR_HEADER, rows), records


def cache_rows(lengths, batches, iters: int, warm_only: bool):
    rows, records = [], []
    _, hkv, d = HEADS["qwen3"]
    for b in batches:
        for n in lengths:
            for s_new in (1, 128):
                past_k, past_v = _rand(b, hkv, n, d), _rand(b, hkv, n, d)
                kc = torch.empty(b, hkv, n + s_new, d, device="cuda", dtype=torch.bfloat16)
                vc = torch.empty_like(kc)
                k_new = _rand(b, s_new, hkv, d).transpose(1, 2)
                v_new = _rand(b, s_new, hkv, d).transpose(1, 2)
                fns = {
                    "torch.cat": functools.partial(_cat_kv, past_k, past_v, k_new, v_new),
                    "tile write": functools.partial(kv_cache_write, k_new, v_new, kc, vc, n),
                }
                if warm_only:
                    for fn in fns.values():
                        fn()
                    continue
                row, rec = cache_table_row(b, n, s_new, interleaved(fns, warmup=5, iters=iters))
                rows.append(row)
                records.append(rec)
    return format_table(CACHE_HEADER, rows), records


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the measurements to this JSON file")
    ap.add_argument(
        "--sweep",
        action="store_true",
        help="time alternative prefill tile shapes and the decode variants",
    )
    ap.add_argument(
        "--only",
        action="append",
        choices=("floor", "prefill", "decode", "cache"),
        help="run only these sections (repeatable; default: all)",
    )
    ap.add_argument(
        "--models", default=",".join(HEADS), help="decode head configs, comma separated"
    )
    ap.add_argument("--warm-only", action="store_true", help="only compile every variant once")
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: no CUDA GPU", file=sys.stderr)
        return 1
    import transformers

    env = (
        f"gpu={torch.cuda.get_device_name()} torch={torch.__version__} cuda={torch.version.cuda} "
        f"transformers={transformers.__version__} cuda-tile={ct.__version__}"
    )
    print(env, flush=True)
    lengths = [256, 512, 1024, 2048, 4096, 8192]
    records = []
    models = tuple(m for m in args.models.split(",") if m)
    sections = (
        (
            "floor",
            "harness floor (same timing as the tables: L2 flushed, CUDA events)",
            lambda: floor_rows(args.iters, args.warm_only),
        ),
        (
            "prefill",
            "prefill (causal, GQA)",
            lambda: prefill_rows([2048, 8192], args.sweep, args.iters, args.warm_only),
        ),
        (
            "decode",
            "decode (1 token, GQA)",
            lambda: decode_rows(lengths, [1, 8], args.iters, args.warm_only, args.sweep, models),
        ),
        (
            "cache",
            "KV cache update, qwen3 kv heads",
            lambda: cache_rows([256, 2048, 8192], [1, 8], args.iters, args.warm_only),
        ),
    )
    for key, title, measure in sections:  # print each table as soon as it is measured
        if args.only and key not in args.only:
            continue
        table, recs = measure()
        if not args.warm_only:
            print(f"\n## {title}\n{table}", flush=True)
            records += recs
    if args.json and not args.warm_only:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"env": env, "records": records}, fh, indent=1)
        os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
