"""cuTile GEMMs vs cuBLAS inside a patched model's generate(), call by call.

The isolated table (`bench_gemm.py`) times one GEMM after an L2 flush and a spin; on the
bandwidth-bound gate/up shapes its verdict moved by 3-5% with how the timed variants were
interleaved. This benchmark measures the GEMMs where they run: one patched twin of the model
(`linear=True`, and by default `swiglu=False`, so the packed QKV and gate_up projections run as
linears) generates with `tilegym.ops.gemm`'s entry points either as they are (cuTile) or routed
to their torch equivalents (cuBLAS `F.linear` on the same packed weights; residual add and
SiLU-and-mul in torch), so both sides see the same weights at the same addresses and the same
neighbouring kernels. Every GEMM call runs inside a `record_function` named
"<op> M=<rows> <N>x<K>"; a call's time is the summed duration of the GPU kernels (CUPTI, no
event overhead) inside that range's GPU-side span (kineto's gpu_user_annotation), so the gaps
between a torch pair's kernels do not count. The CPU-side range's ``device_time_total`` is not
used: on the H200 with torch 2.11 it misses kernels launched through the driver API (every
cuTile kernel), which made a first version of this script report half the cuTile time. The two
sides alternate, ``--reps`` profiled generate()s each after one warm-up; a row reports per-call
medians over all of its calls.

Usage (GPU, repo root, modeling/transformers/src and src on PYTHONPATH):
  python benchmarks/ops/bench_gemm_in_model.py --models llama,qwen3 --batches 1,8,16
"""

from __future__ import annotations

import argparse
import bisect
import json
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


class NoLabelledSpans(RuntimeError):
    """The trace cannot time the GEMM calls (reported as one error line by `main`)."""


def per_call_kernel_us(
    spans: list[tuple[str, int, float, float]], kernels: list[tuple[int, float, float]]
) -> tuple[dict[str, list[float]], int]:
    """({label: [GPU us of each call]}, spans with no kernel) from the labelled calls' GPU-side
    spans ``(label, stream, start, end)`` and the trace's kernels ``(stream, start, end)``: a
    call's time is the summed duration of its stream's kernels that ran inside its span."""
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
        total, found = 0.0, False
        while i < len(ks) and ks[i][0] < end:
            if ks[i][1] <= end:
                total += ks[i][1] - ks[i][0]
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


def _labelled(op: str, fn: Callable) -> Callable:
    from torch.profiler import record_function

    def call(x, w, *args, **kwargs):
        with record_function(label(op, x.numel() // x.shape[-1], w.shape[0], w.shape[1])):
            return fn(x, w, *args, **kwargs)

    return call


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


def bench_model(key: str, batches: list[int], args) -> list[list]:
    import torch
    from tilegym_hf_bench.generation import greedy_config
    from tilegym_hf_bench.model_factory import random_model, twin_sharing_weights

    import tilegym.ops.gemm as gemm
    from tilegym.transformers.monkey_patch import apply_tilegym_kernel

    originals = {op: getattr(gemm, op) for op in OPS}
    impls = {"cutile": originals, "cublas": _torch_gemms()}
    base = random_model(key, "cuda", args.seed).model
    twin = twin_sharing_weights(base)
    handle = apply_tilegym_kernel(twin, swiglu=args.swiglu, linear=True)
    rows = []
    try:
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

            for side in SIDES:  # warm-up: compiles, cuBLAS heuristics, caches
                _route(gemm, impls[side])
                run()
            times: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
            for rep in range(args.reps):
                for side in SIDES if rep % 2 == 0 else SIDES[::-1]:
                    _route(gemm, impls[side])
                    for name, vals in _profiled_times(run).items():
                        times[name][side].extend(vals)
            batch_rows = table_rows(key, batch, times)
            rows += batch_rows
            print(format_table(HEADER, batch_rows), flush=True)
    finally:
        for op, fn in originals.items():
            setattr(gemm, op, fn)
        handle.undo()
    return rows


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
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA GPU", file=sys.stderr)
        return 1
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    rows = []
    try:
        for key in models:
            rows += bench_model(key, batches, a)
    except NoLabelledSpans as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print()
    print(format_table(HEADER, rows))
    print("\n".join(summary(rows)))
    if a.json_out:
        with open(a.json_out + ".tmp", "w") as f:
            json.dump({"header": HEADER, "rows": rows}, f, indent=1)
        os.replace(a.json_out + ".tmp", a.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
