"""cuTile GEMMs vs cuBLAS inside a patched model's generate(), call by call.

The isolated table (`bench_gemm.py`) times one GEMM after an L2 flush and a spin; on the
bandwidth-bound gate/up shapes its verdict moved by 3-5% with how the timed variants were
interleaved. This benchmark measures the GEMMs where they run: one patched twin of the model
(`linear=True`, and by default `swiglu=False`, so the packed QKV and gate_up projections run as
linears) generates with `tilegym.ops.gemm`'s entry points either as they are (cuTile) or routed
to their torch equivalents (cuBLAS `F.linear` on the same packed weights; residual add and
SiLU-and-mul in torch), so both sides see the same weights at the same addresses and the same
neighbouring kernels. Every GEMM call runs inside a `record_function` named
"<op> M=<rows> <N>x<K>"; a call's time is how long the GPU ran its kernels inside that range's
GPU-side span (kineto's gpu_user_annotation; CUPTI kernel times, no event overhead; the union
of the kernels' intervals), so the gaps between a torch pair's kernels do not count. The
CPU-side range's ``device_time_total`` is not used: on the H200 with torch 2.11 it misses
kernels launched through the driver API (every cuTile kernel), which made a first version of
this script report half the cuTile time. The sides take turns, ``--reps`` profiled
generate()s each after one warm-up; a row reports per-call medians over all of its calls.

With ``--candidates SWEEP_JSON`` it also tunes the tile table in this context: each key's
``--top`` configs of an isolated sweep (`bench_gemm.shortlist`) run as extra sides, side i
giving every shortlisted key its i-th config, and ``--tuned-out`` writes the table with each
key's fastest config by geometric-mean time over the key's calls (`pick_in_model`).
``--candidates all`` instead tries every sweep candidate (`candidate_configs`) of the keys of
the calls in ``--buckets`` (`all_candidates`): the small/medium buckets' isolated sweep ranked
configs far from how they ran in the model.

Usage (GPU, repo root, modeling/transformers/src and src on PYTHONPATH):
  python benchmarks/ops/bench_gemm_in_model.py --models llama,qwen3 --batches 1,8,16
  python benchmarks/ops/bench_gemm_in_model.py --candidates sweep.json --top 3 --tuned-out t.json
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import format_table  # noqa: E402

OPS = ("linear", "linear_residual", "fused_gate_up_silu")
SIDES = ("cublas", "cutile")
HEADER = ["model", "batch", "call", "calls", "cuBLAS_us", "cuTile_us", "%cuBLAS"]


def label(op: str, m: int, n: int, k: int) -> str:
    """The record_function name of one GEMM call."""
    return f"{op} M={m} {n}x{k}"


def label_rows(name: str) -> int | None:
    """M of a `label`, or None for any other profiler event."""
    op, _, rest = name.partition(" M=")
    if op not in OPS or not rest:
        return None
    head = rest.split(" ", 1)[0]
    return int(head) if head.isdigit() else None


def table_rows(model: str, batch: int, times: dict[str, dict[str, list[float]]]) -> list[list]:
    """Rows (see HEADER) of the calls timed on both sides, decode (fewest rows) first."""
    rows = []
    for name in sorted(times, key=lambda s: (label_rows(s) or 0, s)):
        per = times[name]
        if not all(per.get(side) for side in SIDES):
            continue
        cb, ct = (statistics.median(per[side]) for side in SIDES)
        rows.append([model, batch, name, len(per["cutile"]), cb, ct, 100.0 * cb / ct])
    return rows


def summary(rows: list[list], decode_max_m: int = 16, prefill_min_m: int = 2048) -> list[str]:
    """Issue-4 verdicts: decode calls (M <= decode_max_m) at >= 100% of cuBLAS and prefill calls
    (M >= prefill_min_m; a --prompt of 2048 gives them) at >= 90%, with the worst of each."""
    lines = []
    groups = (
        (f"decode calls (M <= {decode_max_m})", lambda m: m <= decode_max_m, 100.0),
        (f"prefill calls (M >= {prefill_min_m})", lambda m: m >= prefill_min_m, 90.0),
    )
    for name, wanted, target in groups:
        sel = [r for r in rows if wanted(label_rows(r[2]) or 0)]
        if not sel:
            lines.append(f"no {name} timed")
            continue
        worst = min(sel, key=lambda r: r[6])
        ok = sum(r[6] >= target for r in sel)
        lines.append(
            f"{name} >= {target:.0f}% of cuBLAS: {ok}/{len(sel)}; worst {worst[6]:.1f}% "
            f"({worst[0]} batch {worst[1]} {worst[2]})"
        )
    return lines


def table_key(op: str, m: int, n: int, k: int) -> tuple[str, int, int, bool]:
    """The tile-table key (M bucket, N, K, gated) of a call with a [n, k] weight; N of the
    fused gate-up op is the intermediate size (its weight holds 2N rows)."""
    from tilegym.ops.gemm_configs import m_bucket

    gated = op == "fused_gate_up_silu"
    return m_bucket(m), n // 2 if gated else n, k, gated


def label_key(name: str) -> tuple[str, int, int, bool] | None:
    """`table_key` of a `label`, or None for any other profiler event."""
    m = label_rows(name)
    if m is None:
        return None
    op, _, rest = name.partition(" M=")
    n, k = (int(v) for v in rest.split(" ", 1)[1].split("x"))
    return table_key(op, m, n, k)


def pick_in_model(
    times: dict[str, dict[str, list[float]]], ranks: dict[tuple, int]
) -> dict[tuple, tuple[str, dict[str, float]]]:
    """Per table key timed: (fastest side, {side: % of cuBLAS}) over the sides that ran a
    config of their own for the key: "cutile" (the table's) and "cand1".."candR" for the
    key's ``ranks[key]`` shortlisted configs. A side's % is the geometric mean, over the
    key's calls timed on cuBLAS and all those sides, of median cuBLAS / median side time."""
    logs: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for name, per in times.items():
        key = label_key(name)
        if key is None:
            continue
        sides = ["cutile"] + [f"cand{i}" for i in range(1, ranks.get(key, 0) + 1)]
        if not all(per.get(s) for s in ("cublas", *sides)):
            continue
        cb = statistics.median(per["cublas"])
        for side in sides:
            logs[key][side].append(math.log(cb / statistics.median(per[side])))
    out = {}
    for key, per_side in sorted(logs.items()):
        pct = {s: 100.0 * math.exp(statistics.fmean(v)) for s, v in per_side.items()}
        out[key] = (max(pct, key=pct.get), pct)
    return out


class NoLabelledSpans(RuntimeError):
    """The trace cannot time the GEMM calls (reported as one error line by `main`)."""


def per_call_kernel_us(
    spans: list[tuple[str, int, float, float]], kernels: list[tuple[int, float, float]]
) -> tuple[dict[str, list[float]], int]:
    """({label: [GPU us of each call]}, spans with no kernel) from the labelled calls' GPU-side
    spans ``(label, stream, start, end)`` and the trace's kernels ``(stream, start, end)``: a
    call's time is how long its stream was running one of its kernels inside its span (the
    union of their intervals: a programmatic-dependent kernel that starts before its primary
    ends is not counted twice)."""
    by_stream: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for stream, start, end in kernels:
        by_stream[stream].append((start, end))
    for ks in by_stream.values():
        ks.sort()
    starts = {stream: [k[0] for k in ks] for stream, ks in by_stream.items()}
    out: dict[str, list[float]] = defaultdict(list)
    empty = 0
    for name, stream, start, end in spans:
        ks = by_stream.get(stream, [])
        i = bisect.bisect_left(starts.get(stream, []), start)
        total, reach, found = 0.0, start, False
        while i < len(ks) and ks[i][0] < end:
            k_start, k_end = ks[i]
            if k_end <= end:
                total += max(0.0, k_end - max(k_start, reach))
                reach = max(reach, k_end)
                found = True
            i += 1
        if found:
            out[name].append(total)
        else:
            empty += 1
    return out, empty


def _torch_gemms() -> dict[str, Callable]:
    import torch.nn.functional as F

    def linear(x, w, bias=None, *, out=None, config=None):
        return F.linear(x, w, bias)

    def linear_residual(x, w, residual, *, out=None, config=None):
        return residual + F.linear(x, w)

    def fused_gate_up_silu(x, w, *, out=None, config=None):
        gate, up = F.linear(x, w).chunk(2, dim=-1)
        return F.silu(gate) * up

    return dict(
        linear=linear, linear_residual=linear_residual, fused_gate_up_silu=fused_gate_up_silu
    )


def _shape(x, w) -> tuple[int, int, int]:
    """(M, N, K) of a call on input ``x`` and weight ``w``."""
    return x.numel() // x.shape[-1], w.shape[0], w.shape[1]


def _intercept(impls: dict[str, Callable], hook: Callable) -> dict[str, Callable]:
    """``impls`` with ``hook(op, (M, N, K), kwargs)`` run before each call (it may set
    kwargs, e.g. ``config``)."""

    def wrap(op: str, fn: Callable) -> Callable:
        def call(x, w, *args, **kwargs):
            hook(op, _shape(x, w), kwargs)
            return fn(x, w, *args, **kwargs)

        return call

    return {op: wrap(op, fn) for op, fn in impls.items()}


def _labelled(op: str, fn: Callable) -> Callable:
    from torch.profiler import record_function

    def call(x, w, *args, **kwargs):
        with record_function(label(op, *_shape(x, w))):
            return fn(x, w, *args, **kwargs)

    return call


def _with_configs(originals: dict[str, Callable], configs: dict[tuple, object]) -> dict:
    """The cuTile entry points with ``configs`` ({table key: TileConfig}) in place of the
    table's choice for the keys it has."""

    def pick(op, shape, kwargs):
        cfg = configs.get(table_key(op, *shape))
        if cfg is not None:
            kwargs["config"] = cfg

    return _intercept(originals, pick)


def _route(gemm, impls: dict[str, Callable]) -> None:
    for op in OPS:
        setattr(gemm, op, _labelled(op, impls[op]))


def _profiled_times(run: Callable[[], object]) -> dict[str, list[float]]:
    """Per-call GPU time of the labelled GEMM calls of one profiled ``run()``."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    spans, kernels = [], []
    for e in prof.events():
        if e.device_type != DeviceType.CUDA:
            continue
        where = (e.device_resource_id, e.time_range.start, e.time_range.end)
        if label_rows(e.name) is not None:
            spans.append((e.name, *where))
        elif not e.is_user_annotation:
            kernels.append(where)
    if not spans:
        raise NoLabelledSpans(
            "the profile has no GPU-side span of a labelled GEMM call (kineto's "
            "gpu_user_annotation), so no call can be timed"
        )
    times, empty = per_call_kernel_us(spans, kernels)
    if empty:
        print(f"# {empty} of {len(spans)} labelled calls had no kernel in their span", flush=True)
    return times


def all_candidates(
    calls: set[tuple[str, int, int, int]], top: int, buckets: tuple[str, ...]
) -> dict[tuple, list]:
    """``--candidates all``: per table key of the calls ``(op, M, N, K)`` whose M bucket is in
    ``buckets``, up to ``top`` of its sweep candidates (`candidate_configs`, merged over the
    key's M values in increasing order) other than the table's choice."""
    from tilegym.ops.gemm_configs import candidate_configs, choose_config

    out: dict[tuple, list] = {}
    for op, m, n, k in sorted(calls, key=lambda c: (c[1], c)):
        key = table_key(op, m, n, k)
        bucket, n_key, _, gated = key
        if bucket not in buckets:
            continue
        table = choose_config(m, n_key, k, gated=gated)
        known = out.setdefault(key, [])
        for cfg in candidate_configs(m, n_key, k, gated=gated):
            if cfg != table and cfg not in known:
                known.append(cfg)
    return {key: cfgs[:top] for key, cfgs in out.items()}


def bench_model(
    key: str, batches: list[int], args, shortlist: dict | None = None
) -> tuple[list[list], dict[str, dict[str, list[float]]], dict]:
    """(table rows, {label: {side: per-call us}}, shortlist) of one model over ``batches``.

    Sides are cuBLAS, the table's cuTile configs and, with a ``shortlist`` ({table key:
    [TileConfig]}; ``args.candidates == "all"``: `all_candidates` of this model's calls),
    one side per rank of it ("cand1", ...)."""
    import torch
    from tilegym_hf_bench.generation import greedy_config
    from tilegym_hf_bench.model_factory import random_model, twin_sharing_weights

    import tilegym.ops.gemm as gemm
    from tilegym.transformers.monkey_patch import apply_tilegym_kernel

    originals = {op: getattr(gemm, op) for op in OPS}
    base = random_model(key, "cuda", args.seed).model
    twin = twin_sharing_weights(base)
    handle = apply_tilegym_kernel(twin, swiglu=args.swiglu, linear=True)
    rows = []
    all_times: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    runs = {}
    for batch in batches:
        gen = torch.Generator(device="cuda").manual_seed(args.seed + batch)
        ids = torch.randint(
            0, twin.config.vocab_size, (batch, args.prompt), device="cuda", generator=gen
        )
        config = greedy_config(twin, args.new_tokens)

        def run(ids=ids, config=config):
            with torch.inference_mode():
                twin.generate(
                    input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config
                )

        runs[batch] = run
    try:
        if args.candidates == "all":
            calls: set = set()
            _route(gemm, _intercept(originals, lambda op, shape, _: calls.add((op, *shape))))
            for run in runs.values():
                run()
            shortlist = all_candidates(calls, args.top, tuple(args.buckets.split(",")))
        impls = {"cutile": originals, "cublas": _torch_gemms()}
        for i in range(max(map(len, (shortlist or {}).values()), default=0)):
            ranked = {k: cfgs[i] for k, cfgs in shortlist.items() if i < len(cfgs)}
            impls[f"cand{i + 1}"] = _with_configs(originals, ranked)
        sides = list(impls)
        for batch, run in runs.items():
            for side in sides:  # warm-up: compiles, cuBLAS heuristics, caches
                _route(gemm, impls[side])
                run()
            times: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
            for rep in range(args.reps):
                turn = rep % len(sides)  # each rep starts with another side
                for side in sides[turn:] + sides[:turn]:
                    _route(gemm, impls[side])
                    for name, vals in _profiled_times(run).items():
                        times[name][side].extend(vals)
                        all_times[name][side].extend(vals)
            batch_rows = table_rows(key, batch, times)
            rows += batch_rows
            print(format_table(HEADER, batch_rows), flush=True)
    finally:
        for op, fn in originals.items():
            setattr(gemm, op, fn)
        handle.undo()
    return rows, all_times, shortlist or {}


def tuning_report(
    picks: dict[tuple, tuple[str, dict[str, float]]], shortlist: dict
) -> tuple[list[str], dict[str, list]]:
    """(one report line per key, {table key string: entry} of the keys whose fastest side
    ran a shortlisted config other than the table's own)."""
    from tilegym.ops.gemm_configs import config_name, table_entry

    def cfg_of(key, side):
        return None if side == "cutile" else shortlist[key][int(side[4:]) - 1]

    lines, winners = [], {}
    for key, (best, pct) in picks.items():
        name = "|".join(map(str, key))
        parts = [
            f"{'table' if side == 'cutile' else config_name(cfg_of(key, side))} {value:.1f}%"
            for side, value in pct.items()
        ]
        won = cfg_of(key, best)
        lines.append(f"{name}: {', '.join(parts)} -> {config_name(won) if won else 'table'}")
        if won is not None:
            winners[name] = table_entry(won)
    return lines, winners


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="llama,qwen3")
    p.add_argument("--batches", default="1,8,16")
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens per sequence")
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--reps", type=int, default=3, help="profiled generate()s per side")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--swiglu", action="store_true", help="fused gate-up+SiLU (default: linear)")
    p.add_argument("--json-out", default=None)
    p.add_argument(
        "--candidates",
        default="",
        help="comma-separated bench_gemm --sweep JSONs to tune from, or 'all': every sweep "
        "candidate of the prefill calls' keys",
    )
    p.add_argument("--top", type=int, default=3, help="shortlisted configs per key")
    p.add_argument(
        "--buckets",
        default="small,medium",
        help="M buckets that --candidates all tunes (comma-separated gemm_configs.BUCKETS)",
    )
    p.add_argument("--tuned-out", default=None, help="write the in-model tuned tile table")
    a = p.parse_args(argv)
    from tilegym_hf_bench.presets import PRESETS

    models = [m for m in a.models.split(",") if m]
    if not models or set(models) - set(PRESETS):
        print(f"error: --models {a.models!r}: choose from {', '.join(PRESETS)}", file=sys.stderr)
        return 2
    try:
        batches = [int(b) for b in a.batches.split(",")]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1 or min(a.prompt, a.new_tokens, a.reps) < 1:
        print("error: --batches, --prompt, --new-tokens and --reps must be >= 1", file=sys.stderr)
        return 2
    if a.top < 1:
        print("error: --top must be >= 1", file=sys.stderr)
        return 2
    from tilegym.ops.gemm_configs import BUCKETS

    if not a.buckets or set(a.buckets.split(",")) - set(BUCKETS):
        print(f"error: --buckets {a.buckets!r}: choose from {', '.join(BUCKETS)}", file=sys.stderr)
        return 2
    try:
        paths = [] if a.candidates == "all" else [f for f in a.candidates.split(",") if f]
        short = load_shortlist(paths, a.top)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: --candidates {a.candidates}: {exc}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA GPU", file=sys.stderr)
        return 1
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    rows = []
    times: dict[str, dict[str, list[float]]] = {}
    tuned: dict[tuple, list] = {}
    try:
        for key in models:
            model_rows, model_times, model_short = bench_model(key, batches, a, short)
            rows += model_rows
            times.update(model_times)
            tuned.update(model_short)
    except NoLabelledSpans as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print()
    print(format_table(HEADER, rows))
    print("\n".join(summary(rows)))
    if a.json_out:
        _write(a.json_out, json.dumps({"header": HEADER, "rows": rows}, indent=1))
    if tuned:
        from tilegym.ops.gemm_configs import table_doc, table_text

        lines, winners = tuning_report(
            pick_in_model(times, {k: len(v) for k, v in tuned.items()}), tuned
        )
        print("\n# in-model tuning (% of cuBLAS, geometric mean over the key's calls)")
        print("\n".join(lines))
        if a.tuned_out:
            _write(a.tuned_out, table_text({**table_doc(), **winners}))
            print(f"# {len(winners)} keys changed -> {a.tuned_out}")
    return 0


def _write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def load_shortlist(paths: list[str], top: int) -> dict[tuple, list]:
    """{table key: up to ``top`` configs} from isolated sweeps' JSONs (`bench_gemm.shortlist`),
    without the table's own config (the "cutile" side runs it)."""
    if not paths:
        return {}
    from bench_gemm import shortlist

    from tilegym.ops.gemm_configs import TUNED

    rows = []
    for path in paths:
        with open(path) as f:
            rows += json.load(f)["rows"]
    ranked = shortlist({"rows": rows}, top + 1)
    return {k: [c for c in v if c != TUNED.get(k)][:top] for k, v in ranked.items()}


if __name__ == "__main__":
    sys.exit(main())
