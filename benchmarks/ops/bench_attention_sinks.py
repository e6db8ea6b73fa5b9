"""gpt-oss decode attention with sinks: cuTile vs SDPA and transformers' eager attention (H200).

    python benchmarks/ops/bench_attention_sinks.py [--lengths 128,512,2048,8192]
        [--batches 1,8] [--windows full,128] [--sinks on,off] [--iters 30] [--json FILE]
        [--warm-only]

Heads are gpt-oss-20b's (64 query heads on 8 KV heads of 64, scale 1/8), bf16, one new token
over a cache of ``n`` keys. Each row times, interleaved call by call:

- ``tile``: sinks on, ``tilegym.ops.attention_sinks.decode_attention_sinks`` as shipped
  (``SINK_EPILOGUE``), what the patched model runs; sinks off, the shared
  ``tilegym.ops.attention.decode_attention`` (the other families' kernel). Full rows read the
  keys up to a device ``position`` (``n - 1``), as the static cache's decode step does.
- ``other``: sinks on, the same call with the other ``sink_epilogue`` setting (a one-split plan's
  sink in the kernel's epilogue, or partials + the sink reduction); where the plan splits the
  keys both settings run the same kernels. Sinks off: ``tile`` again.
- ``eager``: transformers' ``eager_attention_forward``: gpt-oss's (the sink column joins the
  softmax) with sinks on, Llama's with sinks off; GQA by ``repeat_kv``, as upstream runs it.
- ``sdpa``: ``scaled_dot_product_attention(enable_gqa=True)``; with sinks on the sink is one
  extra key of zero value whose logit is the sink (a zero key, and the sink in the additive
  mask's last column), key and mask built once outside the timed call. A float mask keeps SDPA
  off its flash kernel, so sinks-on rows also time ``flash``: the same SDPA call without the
  sinks or a mask (its flash path; a bound, not the same computation); in sinks-off rows
  ``flash`` is ``sdpa``.

Window rows (``128``): the cuTile kernel gets the whole ``n``-key cache and ``window=128`` (the
eager-mode cache, the kernel skipping the keys outside the window); the baselines get the last
128 keys only, which is what transformers' sliding cache holds (its best case). Under the
static cache the patched sliding layers keep a 128-slot ring buffer, read as a full cache of
128 keys: the ``full`` row at ``n = 128``.

Every variant's output is checked against the fp32 reference first (``err``: the largest
relative error of the row's variants). Times are medians of CUDA-event timed calls after
warm-up, L2 flushed before each call; spread = (p90 - p10) / median.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import Stats, flush_mode, format_table, interleaved  # noqa: E402

HQ, HKV, D = 64, 8, 64  # gpt-oss-20b
SCALE = D**-0.5
WINDOW = 128
HEADER = [
    "batch",
    "cache",
    "window",
    "sinks",
    "eager us",
    "sdpa us",
    "flash us",
    "tile us",
    "tile spread %",
    "other us",
    "vs eager",
    "vs sdpa",
    "vs flash",
    "tile GB/s",
    "err",
]
MAX_ERR = 2e-2
"""Largest relative error (||out - ref|| / ||ref||, fp32 reference) a bf16 variant may have."""


def _positive_ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated positive integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated positive integers")
    return values


def _windows(text: str) -> list[int | None]:
    out: list[int | None] = []
    for v in text.split(","):
        if v == "full":
            out.append(None)
        elif v.isdigit() and int(v) > 0:
            out.append(int(v))
        else:
            raise argparse.ArgumentTypeError(f"{v!r}: a window is 'full' or a positive integer")
    return out


def _sinks(text: str) -> list[bool]:
    names = {"on": True, "off": False}
    if not text or any(v not in names for v in text.split(",")):
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated 'on' and 'off'")
    return [names[v] for v in text.split(",")]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=_positive_ints, default=[128, 512, 2048, 8192])
    ap.add_argument("--batches", type=_positive_ints, default=[1, 8])
    ap.add_argument("--windows", type=_windows, default=[None, WINDOW], help="full and/or N")
    ap.add_argument("--sinks", type=_sinks, default=[True, False], help="on and/or off")
    ap.add_argument("--iters", type=_positive_ints, default=[30], help="timed calls a variant")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--warm-only", action="store_true", help="run every variant once, no table")
    args = ap.parse_args(argv)
    if len(args.iters) != 1:
        ap.error("--iters takes one positive integer")
    args.iters = args.iters[0]
    return args


def cases(lengths, batches, windows, sinks) -> list[tuple[int, int, int | None, bool]]:
    """(batch, cache length, window, sinks) per row; a window row only where the cache is
    longer than the window (otherwise it is the full row)."""
    return [
        (b, n, w, s)
        for s in sinks
        for w in windows
        for b in batches
        for n in lengths
        if w is None or n > w
    ]


def kv_bytes(batch: int, keys: int, hkv: int = HKV, d: int = D, elem: int = 2) -> int:
    """Bytes of keys and values one decode step must read."""
    return 2 * batch * hkv * keys * d * elem


def sdpa_sink_inputs(k, v, sinks, hq: int):
    """(keys, values, additive mask) for SDPA to compute attention with sinks: one extra key
    and value of zeros (the key's logit is 0) and the mask's last column the head's sink, so
    that key's weight is the sink's and its value adds nothing."""
    b, hkv, n, d = k.shape
    zeros = k.new_zeros(b, hkv, 1, d)
    mask = torch.zeros(b, hq, 1, n + 1, dtype=k.dtype, device=k.device)
    mask[..., -1] = sinks.to(k.dtype).view(1, hq, 1)
    return torch.cat([k, zeros], 2), torch.cat([v, zeros], 2), mask


def sdpa(q, k, v, mask=None):
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=SCALE, enable_gqa=True
    )


def eager(q, k, v, sinks):
    """transformers' eager attention as the model calls it (no mask: every key is visible):
    gpt-oss's with sinks, Llama's without. Returns ``[B, 1, Hq, D]``."""
    from transformers.models.gpt_oss import modeling_gpt_oss
    from transformers.models.llama import modeling_llama

    groups = q.shape[1] // k.shape[1]
    module = SimpleNamespace(sinks=sinks, num_key_value_groups=groups, training=False)
    fn = modeling_gpt_oss if sinks is not None else modeling_llama
    return fn.eager_attention_forward(module, q, k, v, None, scaling=SCALE)[0]


def rel_err(out, ref) -> float:
    out = out.float().reshape(ref.shape)
    return float((out - ref).norm() / ref.norm())


def table_row(case, stats: dict[str, Stats], err: float) -> tuple[list, dict]:
    """One table row and its JSON record from a case and its variants' stats."""
    b, n, w, s = case
    e, p, t = stats["eager"], stats["sdpa"], stats["tile"]
    f = stats.get("flash", p)  # sinks off: SDPA is already the flash kernel's call
    o = stats.get("other", t)  # sinks off: one decode kernel
    keys = n if w is None else min(n, w)
    row = [b, n, "full" if w is None else w, "on" if s else "off", e.median_us, p.median_us]
    row += [f.median_us, t.median_us, t.spread_pct, o.median_us]
    row += [f"{e.median_us / t.median_us:.2f}x"]
    row += [f"{p.median_us / t.median_us:.2f}x", f"{f.median_us / t.median_us:.2f}x"]
    row += [kv_bytes(b, keys) / t.median_us / 1e3]
    row += [f"{err:.1e}" + ("" if err <= MAX_ERR else " FAIL")]
    record = {"batch": b, "cache": n, "window": w, "sinks": s, "err": err}
    record.update({f"{k}_us": v.median_us for k, v in stats.items()})
    record.update({f"{k}_spread": v.spread_pct for k, v in stats.items()})
    return row, record


def variants(case, gen):
    """The row's callables and the largest relative error of their outputs (checked first)."""
    from tilegym.ops.attention import decode_attention, reference_mask
    from tilegym.ops.attention_sinks import (
        SINK_EPILOGUE,
        decode_attention_sinks,
        reference_attention_sinks,
    )

    b, n, w, s = case

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").to(torch.bfloat16)

    q, k, v = rand(b, HQ, 1, D), rand(b, HKV, n, D), rand(b, HKV, n, D)
    sinks = rand(HQ) * 2 if s else None
    if w is None:  # the static cache's form: keys up to a device position
        kw = dict(scale=SCALE, position=torch.tensor([n - 1], dtype=torch.int32, device="cuda"))
    else:  # the eager-mode cache's form: n keys on the host, the window skipping the rest
        kw = dict(scale=SCALE, kv_end=n, window=w)
    keep = n if w is None else min(n, w)
    kb, vb = k[:, :, n - keep :].contiguous(), v[:, :, n - keep :].contiguous()
    if s:
        ks, vs, mask = sdpa_sink_inputs(kb, vb, sinks, HQ)
        fns = {
            "eager": lambda: eager(q, kb, vb, sinks),
            "sdpa": lambda: sdpa(q, ks, vs, mask),
            "flash": lambda: sdpa(q, kb, vb),
            "tile": lambda: decode_attention_sinks(q, k, v, sinks, **kw),
            "other": lambda: decode_attention_sinks(
                q, k, v, sinks, sink_epilogue=not SINK_EPILOGUE, **kw
            ),
        }
        ref_sinks = sinks
    else:
        fns = {
            "eager": lambda: eager(q, kb, vb, None),
            "sdpa": lambda: sdpa(q, kb, vb),
            "tile": lambda: decode_attention(q, k, v, **kw),
        }
        ref_sinks = torch.full((HQ,), float("-inf"), device="cuda")
    visible = reference_mask(b, 1, n, q_start=n - 1, window=w, device="cuda")
    ref = reference_attention_sinks(q, k, v, visible, ref_sinks, SCALE)  # [B, 1, Hq, D]
    with torch.no_grad():  # flash computes attention without the sinks: not compared
        err = max(
            rel_err(fn().transpose(1, 2) if name == "sdpa" else fn(), ref)
            for name, fn in fns.items()
            if name != "flash"
        )
    return fns, err


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("error: bench_attention_sinks times CUDA kernels; no CUDA GPU here", file=sys.stderr)
        return 1
    import cuda.tile as ct
    import transformers

    env = (
        f"gpu={torch.cuda.get_device_name()} torch={torch.__version__} "
        f"transformers={transformers.__version__} cuda-tile={ct.__version__} "
        f"L2 flush={flush_mode()}"
    )
    print(env, flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, records = [], []
    for case in cases(args.lengths, args.batches, args.windows, args.sinks):
        fns, err = variants(case, gen)
        if args.warm_only:
            continue
        with torch.no_grad():
            stats = interleaved(fns, iters=args.iters)
        row, record = table_row(case, stats, err)
        rows.append(row)
        records.append(record)
    if args.warm_only:
        print("warm: every variant ran once")
        return 0
    print(format_table(HEADER, rows), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"env": env, "records": records}, fh, indent=1)
    return 1 if any(r["err"] > MAX_ERR for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
