"""Qwen3.5 linear-attention ops on the GPU: cuTile vs flash-linear-attention (Triton) vs torch.

Rows: the gated delta rule's prefill (chunked) and decode (recurrent, state in place) at
Qwen3.5-0.8B's heads (16 q/k and 16 v heads of 128) and the larger models' (16 / 32), then the
causal conv1d (prefill and decode) and the gated RMSNorm against transformers' torch code.
Every variant starts from the raw projections (a, b, A_log, dt_bias): fla and torch get the
gates from the module's torch expressions inside the timed call, as the model computes them;
cuTile fuses them. Times are medians of CUDA-event intervals, variants interleaved after a
warm-up, with the p10-p90 spread in percent. ``err`` is each variant's relative error against
the fp32 recurrent reference (outputs; a quick parity check, not a test; ``-`` above 2048
tokens, where the token-by-token reference would take minutes). ``cutile-one-kernel`` is the
scan in one kernel doing the state and the output chunk by chunk (``split=False``), what the
split scan replaced; ``cutile-fp32prep`` the UT and apply kernels' products at fp32 accuracy
(split tf32, ``ut_tf32=False, apply_tf32=False``), what the tf32 forms replaced.
``--kernels`` adds, per prefill shape, each cuTile form's time by kernel (torch.profiler's
CUDA time, mean of ``--iters`` calls): where a form's time goes. ``--form NAME:KEY=INT,...``
(repeatable; ``KEY=none`` passes None) adds a prefill column: ``gated_delta_chunk`` with those
keyword arguments, e.g. ``--form occ2:occupancy=2 --form cpb2:chunks_per_block=2``.

fla is optional: install the wheel into any folder on the GPU host and put it on PYTHONPATH
(``pip install --no-deps --target /tmp/fla-site flash_linear_attention-0.6.0 fla_core-0.6.0``;
it needs triton and einops); without it the fla columns say ``-``.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import format_table, interleaved  # noqa: E402

from tilegym.ops import causal_conv1d as cc  # noqa: E402
from tilegym.ops import gated_delta as gd  # noqa: E402
from tilegym.ops import rms_norm_gated as rg  # noqa: E402
from tilegym.ops.testing import rel_err  # noqa: E402

HEADS = {"0.8b": (16, 16, 128, 128), "16/32": (16, 32, 128, 128)}
PREFILL = [(1, 512), (1, 2048), (1, 8192), (4, 4096)]
DECODE = [1, 8, 64]


def _fla():
    try:
        from fla.ops.gated_delta_rule import (
            chunk_gated_delta_rule,
            fused_recurrent_gated_delta_rule,
        )
    except Exception as exc:  # not installed, or no triton
        print(f"(fla not available: {exc})")
        return None, None
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def _inputs(bsz, n_tok, heads, dt=torch.bfloat16):
    hk, hv, dk, dv = heads
    conv = torch.randn(bsz, n_tok, 2 * hk * dk + hv * dv, device="cuda", dtype=dt)
    q = conv[..., : hk * dk].view(bsz, n_tok, hk, dk)
    k = conv[..., hk * dk : 2 * hk * dk].view(bsz, n_tok, hk, dk)
    v = conv[..., 2 * hk * dk :].view(bsz, n_tok, hv, dv)
    a = torch.randn(bsz, n_tok, hv, device="cuda", dtype=dt)
    b = torch.randn(bsz, n_tok, hv, device="cuda", dtype=dt)
    A_log = torch.empty(hv, device="cuda").uniform_(0.01, 16).log().to(dt)
    dt_bias = torch.rand(hv, device="cuda").to(dt)
    return q, k, v, a, b, A_log, dt_bias


def _hf():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    return m


def _grouped(q, k, v):
    """q/k repeated to the value heads, as transformers 5.17's module does before the torch
    functions (5.2x's functions repeat them themselves)."""
    rep = v.shape[2] // q.shape[2]
    if rep == 1:
        return q, k
    return q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)


def _torch_chunk(q, k, v, a, b, A_log, dt_bias, state=None):
    g, beta = gd.gates_reference(a, b, A_log, dt_bias)
    q, k = _grouped(q, k, v)
    return _hf().torch_chunk_gated_delta_rule(
        q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip


def _torch_recurrent(q, k, v, a, b, A_log, dt_bias, state):
    g, beta = gd.gates_reference(a, b, A_log, dt_bias)
    q, k = _grouped(q, k, v)
    out, new = _hf().torch_recurrent_gated_delta_rule(
        q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    state.copy_(new)
    return out


def _fla_chunk(fn, q, k, v, a, b, A_log, dt_bias):
    g, beta = gd.gates_reference(a, b, A_log, dt_bias)
    return fn(q, k, v, g=g, beta=beta, output_final_state=True, use_qk_l2norm_in_kernel=True)


def _fla_recurrent(fn, q, k, v, a, b, A_log, dt_bias, state):
    g, beta = gd.gates_reference(a, b, A_log, dt_bias)
    out, new = fn(
        q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    state.copy_(new)
    return out


def _row(label, fns, ref, warmup, iters, cols, reset=None):
    """One table row; ``reset`` (if given) puts the state back before each error check (the
    timed calls then advance their states freely)."""
    errs = {}
    for name, fn in list(fns.items()):
        if reset is not None:
            reset()
        try:
            out = fn()
        except Exception as exc:  # e.g. a layout fla does not take: report, leave it out
            print(f"{label}: {name} failed: {type(exc).__name__}: {exc}", flush=True)
            del fns[name]
            continue
        out = out[0] if isinstance(out, tuple) else out
        errs[name] = f"{rel_err(out, ref):.1e}" if ref is not None else "-"
    stats = interleaved(fns, warmup=warmup, iters=iters)
    row = [label]
    base = stats.get("cutile")
    for name in cols:
        s = stats.get(name)
        if s is None:
            row += ["-", "-", "-"]
            continue
        speed = f"{s.median_us / base.median_us:.2f}x" if base else "-"
        row += [f"{s.median_us:.1f} ±{s.spread_pct:.0f}%", speed, errs[name]]
    return row


def _print_kernel_times(label, fns, iters) -> None:
    """Each function's mean CUDA time per call by kernel, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    for name, fn in fns.items():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
        times: dict[str, float] = {}
        for event in prof.key_averages():
            us = getattr(event, "device_time_total", None)  # torch 2.11: no cuda_time_total
            if us is None:
                us = getattr(event, "cuda_time_total", 0)
            if us:
                kernel = event.key.split("_Kt")[0]  # the name without its signature suffix
                times[kernel] = times.get(kernel, 0) + us
        parts = ", ".join(
            f"{k} {v / iters:.1f}" for k, v in sorted(times.items(), key=lambda kv: -kv[1])
        )
        print(f"kernels {label} {name} (us a call): {parts}", flush=True)


def _form(text: str) -> tuple[str, dict]:
    """``NAME:KEY=INT,...`` into (name, keyword arguments), ``KEY=none`` for None (an occupancy
    left to the compiler); one clear error otherwise."""
    name, _, spec = text.partition(":")
    kwargs = {}
    for item in filter(None, spec.split(",")):
        key, eq, value = item.partition("=")
        if eq and value == "none":
            kwargs[key] = None
            continue
        if not eq or not value.lstrip("-").isdigit():
            raise argparse.ArgumentTypeError(f"form {text!r}: {item!r} is not KEY=INT or KEY=none")
        kwargs[key] = int(value)
    if not name or not kwargs:
        raise argparse.ArgumentTypeError(f"form {text!r}: want NAME:KEY=INT[,KEY=INT...]")
    return name, kwargs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--no-torch-prefill", action="store_true", help="skip torch's chunked form")
    p.add_argument("--heads", nargs="*", default=list(HEADS), choices=list(HEADS))
    p.add_argument("--prefill", nargs="*", default=[f"{b}x{t}" for b, t in PREFILL],
                   help="BxT prefill shapes")  # fmt: skip
    p.add_argument("--decode", nargs="*", type=int, default=DECODE, help="decode batch sizes")
    p.add_argument("--no-conv-norm", action="store_true", help="only the gated delta rule")
    p.add_argument("--kernels", action="store_true", help="each prefill form's time by kernel")
    p.add_argument("--form", type=_form, action="append", default=[],
                   help="NAME:KEY=INT,...: a prefill column with these arguments")  # fmt: skip
    args = p.parse_args()
    forms = dict(args.form)
    prefill = [tuple(int(n) for n in s.split("x")) for s in args.prefill]
    fla_chunk, fla_rec = _fla()
    cols = [
        "cutile",
        "cutile-one-kernel",
        "cutile-fp32prep",
        *forms,
        "fla",
        "torch",
    ]
    header = ["case"] + [f"{c} {h}" for c in cols for h in ("us", "/cutile", "err")]
    rows = []
    for hname in args.heads:
        heads = HEADS[hname]
        for bsz, n_tok in prefill:
            x = _inputs(bsz, n_tok, heads)
            g, beta = gd.gates_reference(*x[3:])
            ref = gd.recurrent_reference(*x[:3], g, beta)[0] if n_tok <= 2048 else None
            fns = {
                "cutile": partial(gd.gated_delta_chunk, *x),
                "cutile-one-kernel": partial(gd.gated_delta_chunk, *x, split=False),
                "cutile-fp32prep": partial(
                    gd.gated_delta_chunk, *x, ut_tf32=False, apply_tf32=False
                ),
                **{n: partial(gd.gated_delta_chunk, *x, **kw) for n, kw in forms.items()},
            }
            if args.kernels:
                by_kernel = {n: f for n, f in fns.items() if n.startswith("cutile") or n in forms}
                _print_kernel_times(f"{hname} {bsz}x{n_tok}", by_kernel, args.iters)
            if fla_chunk is not None:
                fns["fla"] = partial(_fla_chunk, fla_chunk, *x)
            if not args.no_torch_prefill:
                fns["torch"] = partial(_torch_chunk, *x)
            label = f"prefill {hname} {bsz}x{n_tok}"
            rows.append(_row(label, fns, ref, args.warmup, args.iters, cols))
            print(rows[-1], flush=True)
        for bsz in args.decode:
            x = _inputs(bsz, 1, heads)
            hv, dk, dv = heads[1:]
            s0 = torch.randn(bsz, hv, dk, dv, device="cuda") * 0.1
            g, beta = gd.gates_reference(*x[3:])
            ref = gd.recurrent_reference(*x[:3], g, beta, s0)[0]
            states = {n: s0.clone() for n in cols}
            fns = {"cutile": partial(gd.gated_delta_recurrent, *x, states["cutile"])}
            if fla_rec is not None:
                fns["fla"] = partial(_fla_recurrent, fla_rec, *x, states["fla"])
            fns["torch"] = partial(_torch_recurrent, *x, states["torch"])
            label = f"decode {hname} B={bsz}"

            def reset(states=states, s0=s0):
                for s in states.values():
                    s.copy_(s0)

            rows.append(_row(label, fns, ref, args.warmup, args.iters, cols, reset))
            print(rows[-1], flush=True)
    if not args.no_conv_norm:
        rows += _conv_norm_rows(args, cols)
    print()
    print(format_table(header, rows))


def _conv_norm_rows(args, cols) -> list:
    """conv and gated norm vs transformers' torch code (no fla column)."""
    rows = []
    hf = _hf()
    for ch, (bsz, n_tok) in [(6144, (1, 2048)), (6144, (4, 4096)), (8192, (1, 2048))]:
        x = torch.randn(bsz, n_tok, ch, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(ch, 4, device="cuda", dtype=torch.bfloat16) * 0.5
        ref = cc.causal_conv1d_reference(x.float(), w.float())[0]
        fns = {
            "cutile": partial(cc.causal_conv1d, x, w),
            "torch": lambda x=x, w=w: hf.causal_conv1d_fn(
                x.transpose(1, 2), w, None, "silu"
            ).transpose(1, 2),
        }
        label = f"conv prefill C={ch} {bsz}x{n_tok}"
        rows.append(_row(label, fns, ref, args.warmup, args.iters, cols))
        print(rows[-1], flush=True)
    for ch, bsz in [(6144, 1), (6144, 64), (8192, 8)]:
        x = torch.randn(bsz, 1, ch, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(ch, 4, device="cuda", dtype=torch.bfloat16) * 0.5
        st = torch.randn(bsz, ch, 4, device="cuda", dtype=torch.bfloat16)
        st1, st2 = st.clone(), st.clone()
        ref = cc.causal_conv1d_reference(x.float(), w.float(), state=st.float())[0]
        fns = {
            "cutile": partial(cc.causal_conv1d_update, x, st1, w),
            "torch": lambda x=x, s=st2, w=w: hf.causal_conv1d_update(
                x.transpose(1, 2), s, w, None, "silu"
            ).transpose(1, 2),
        }

        def reset(st=st, st1=st1, st2=st2):
            st1.copy_(st)
            st2.copy_(st)

        label = f"conv decode C={ch} B={bsz}"
        rows.append(_row(label, fns, ref, args.warmup, args.iters, cols, reset))
        print(rows[-1], flush=True)
    for rows_n in (16, 16 * 2048, 32 * 4 * 4096):
        x = torch.randn(rows_n, 128, device="cuda", dtype=torch.bfloat16)
        z = torch.randn(rows_n, 128, device="cuda", dtype=torch.bfloat16)
        mod = hf.Qwen3_5RMSNormGated(128).to("cuda", torch.bfloat16)
        ref = rg.rms_norm_gated_reference(x.float(), z.float(), mod.weight.float(), 1e-6)
        fns = {
            "cutile": partial(rg.rms_norm_gated, x, z, mod.weight, 1e-6),
            "torch": partial(mod, x, z),
        }
        rows.append(_row(f"gated norm {rows_n}x128", fns, ref, args.warmup, args.iters, cols))
        print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    with torch.inference_mode():
        main()
