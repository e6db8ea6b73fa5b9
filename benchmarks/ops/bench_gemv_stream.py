"""One-row GEMMs as a decode step streams them: a model's projection, one weight per layer,
back to back in a CUDA graph, for each tile config against cuBLAS and the tile table's choice.

The isolated table (`bench_gemm.py`) times one call after an L2 flush; a decode step instead
runs each projection once a layer with the next layer's weight right behind it. Here every
variant is a graph of ``--layers`` calls of one projection, each call on its own weight (the
weights together far above L2), replayed in turn with the other variants (`_graph_timing`).
A row: µs a call (median of the replays, min-max), the weight's read rate in TB/s, and that
rate as a share of the GPU's copy rate (`_timing.copy_tbps`, read + write of 1 GiB: what a
memory-bound kernel can reach) and of its spec bandwidth. Every variant's output is checked
against an fp32 reference first (outputs poisoned with NaN before the check).

    python benchmarks/ops/bench_gemv_stream.py --models olmo3 [--projs qkv,gate_up] \\
        [--layers 32] [--replays 20] [--candidates table|gemv|all] [--json-out F] \\
        [--tuned-out TABLE]

Candidates: ``table`` (cuBLAS and the table's config), ``gemv`` (also every GEMV config of
`gemm_configs.gemv_candidates`, blocks-per-SM hints included; the
gated projection gets the swapped and GEMV tiles of `candidate_configs`, plus the probe
`NORM_PROBE_TILES`; the QKV projection the probes of RoPE in the norm GEMV's epilogue,
`rms_norm_linear_rope`, at its tile and at `ROPE_PROBE_TILES`, against the norm GEMV then
the RoPE kernel it replaces), ``all``
(every `candidate_configs` config). ``--tuned-out`` writes the shipped tile table with a
projection's fastest config in place of the table's where its slowest replay beat the table
config's fastest (`winner`): a whole table for TILEGYM_GEMM_TILES.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _graph_timing import interleaved_graphs  # noqa: E402
from _timing import copy_tbps, format_table, running_gpu_tbps  # noqa: E402
from bench_gemm import MODELS  # noqa: E402

from tilegym.ops import gemm, library  # noqa: E402
from tilegym.ops import rope as rope_ops  # noqa: E402
from tilegym.ops.gemm_configs import (  # noqa: E402
    TileConfig,
    candidate_configs,
    choose_config,
    config_name,
    gemv_candidates,
    m_bucket,
    table_doc,
    table_entry,
    table_text,
)

NORM_EPS = 1e-6
#: the gated projection's probe: the one-row gate/up GEMV kernel there is, `rms_norm_gate_up`'s
#: (it also does the RMSNorm before it), at its tile and with more blocks an SM; not a table
#: candidate
NORM_PROBE_TILES = (
    TileConfig(1, 2, 1024, gemv=True),
    TileConfig(1, 2, 1024, occupancy=8, gemv=True),
    TileConfig(1, 4, 1024, occupancy=6, gemv=True),
)
#: the QKV probes' names: the norm + QKV GEMV then the RoPE kernel (what `norm_gemv` 1 runs;
#: for a model with per-head q/k norms the q/k norm + RoPE kernel, one head a block as qwen3
#: ships it), and `rms_norm_linear_rope`'s one launch (`rope_gemv` 1)
ROPE_PROBES = ("probe: norm gemv, then rope kernel", "probe: norm + rope gemv")
#: the fused launch's tiles beside its own (`gemm.NORM_ROPE_TILE`): fewer blocks a head (the
#: per-head norms' last-block phase waits on all of them) and more outputs a block
ROPE_PROBE_TILES = (
    TileConfig(1, 4, 1024, occupancy=6, gemv=True),
    TileConfig(1, 8, 512, occupancy=4, gemv=True),
    TileConfig(1, 8, 256, occupancy=8, gemv=True),
)
#: the decode position the probes' cos/sin are taken at
ROPE_POSITION = 2112
HEADER = ["model", "proj", "N", "K", "variant", "us/call", "min-max", "TB/s", "%copy", "%spec"]


#: a decode layer's projections, in `projections`' order
PROJECTIONS = ("qkv", "o_proj", "gate_up", "down")


def rope_tables(d: int, device="cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 cos/sin ``[1, d]`` of one decode position (both halves equal, as HF's tables)."""
    inv = 500000.0 ** (-torch.arange(0, d, 2, device=device, dtype=torch.float64) / d)
    freqs = torch.cat((ROPE_POSITION * inv, ROPE_POSITION * inv))[None]
    return freqs.cos().to(torch.bfloat16), freqs.sin().to(torch.bfloat16)


def projections(model: str) -> dict[str, tuple[str, int, int]]:
    """{name: (op, N, K)} of a decode layer; op as in `bench_gemm.rows_for`."""
    c = MODELS[model]
    h, q, kv, i = c["hidden"], c["q"], c["kv"], c["inter"]
    return {
        "qkv": ("linear", q + 2 * kv, h),
        "o_proj": ("residual", h, q),
        "gate_up": ("gated", i, h),
        "down": ("residual", h, i),
    }


def configs(op: str, n: int, k: int, which: str) -> list[TileConfig]:
    """The cuTile configs timed for one projection (the table's choice first)."""
    gated = op == "gated"
    out = [choose_config(1, n, k, gated=gated)]
    if which == "all":
        out += candidate_configs(1, n, k, gated=gated)
    elif which == "gemv" and gated:
        out += [c for c in candidate_configs(1, n, k, gated=True) if c.swap or c.gemv]
    elif which == "gemv":
        out += gemv_candidates(1, k)
    return list(dict.fromkeys(out))


class Stream:
    """``layers`` weights of one projection and the callables that run it over all of them."""

    def __init__(self, op: str, n: int, k: int, layers: int) -> None:
        self.op, self.n, self.k = op, n, k
        rows = 2 * n if op == "gated" else n
        self.x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        self.r = torch.randn(1, n, device="cuda", dtype=torch.bfloat16)
        self.ws = [
            torch.randn(rows, k, device="cuda", dtype=torch.bfloat16) / k**0.5
            for _ in range(layers)
        ]
        self.out = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        self.nw = 1 + 0.1 * torch.randn(k, device="cuda", dtype=torch.bfloat16)
        self.nbytes = rows * k * 2
        self.heads = (0, 0, 1)  # (q heads, kv heads, head width) of a QKV projection
        self.head_norms = None  # per-head q/k norms between the projection and RoPE

    def set_heads(self, hq: int, hk: int, d: int, qk_norm: bool) -> None:
        """The QKV projection's head layout (and per-head q/k norms), for the RoPE probes."""
        self.heads = (hq, hk, d)
        self.cos, self.sin = rope_tables(d)
        if qk_norm:
            qw, kw = (1 + 0.1 * torch.randn(d, device="cuda", dtype=torch.bfloat16) for _ in "qk")
            self.head_norms = gemm.HeadNorms(qw, kw, NORM_EPS, hq)

    def normed_x(self) -> torch.Tensor:
        x = self.x.float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * self.nw.float()

    def rope_reference(self, w: torch.Tensor) -> torch.Tensor:
        """fp32 RMSNorm(x) @ w^T with q's and k's heads (head-normed where the model has
        per-head norms) rotated: the ops' own reference, run on fp32 tensors."""
        hq, hk, _ = self.heads
        heads = self.head_norms
        if heads is not None:
            heads = gemm.HeadNorms(heads.q_weight.float(), heads.k_weight.float(), heads.eps, hq)
        cos, sin = self.cos.float(), self.sin.float()
        args = (self.normed_x(), w.float(), None, cos, sin, hq + hk, heads)
        return library.rms_norm_linear_rope_reference(*args)

    def norm_rope(self, w: torch.Tensor, cfg: TileConfig | None = None) -> torch.Tensor:
        hq, hk, _ = self.heads
        args = (self.x, self.nw, NORM_EPS, w, None, self.cos, self.sin, hq + hk)
        heads = self.head_norms
        return gemm.rms_norm_linear_rope(*args, head_norms=heads, out=self.out, config=cfg)

    def norm_then_rope(self, w: torch.Tensor):
        """The two launches `norm_rope` replaces: (rotated q, rotated k), v left in ``out``."""
        hq, hk, d = self.heads
        y = gemm.rms_norm_linear(self.x, self.nw, NORM_EPS, w, out=self.out)
        cos, sin = self.cos[None], self.sin[None]
        if self.head_norms is not None:
            q, k = y[:, : hq * d].view(1, 1, hq, d), y[:, hq * d : (hq + hk) * d].view(1, 1, hk, d)
            h = self.head_norms
            return rope_ops.qk_norm_rope(
                q, k, h.q_weight, h.k_weight, h.eps, cos, sin, decode_heads=1
            )
        q = y[:, : hq * d].view(1, 1, hq, d).transpose(1, 2)
        k = y[:, hq * d : (hq + hk) * d].view(1, 1, hk, d).transpose(1, 2)
        return rope_ops.apply_rope(q, k, cos, sin)

    def norm_then_rope_joined(self, w: torch.Tensor) -> torch.Tensor:
        """`norm_then_rope`'s result as one row, for its error (outside the timed graph)."""
        hq, hk, d = self.heads
        q, k = self.norm_then_rope(w)
        parts = (q.transpose(1, 2).reshape(1, -1), k.transpose(1, 2).reshape(1, -1))
        return torch.cat((*parts, self.out[:, (hq + hk) * d :]), dim=-1)

    def reference(self, w: torch.Tensor) -> torch.Tensor:
        y = self.x.float() @ w.float().t()
        if self.op == "gated":
            g, u = y.chunk(2, dim=-1)
            return F.silu(g) * u
        return y + self.r.float() if self.op == "residual" else y

    def cublas(self, w: torch.Tensor) -> torch.Tensor:
        y = F.linear(self.x, w)
        if self.op == "gated":
            g, u = y.chunk(2, dim=-1)
            return F.silu(g) * u
        return self.r + y if self.op == "residual" else y

    def normed_reference(self, w: torch.Tensor) -> torch.Tensor:
        """The gated reference on RMSNorm(x) (the norm-prologue probe's op)."""
        g, u = (self.normed_x() @ w.float().t()).chunk(2, dim=-1)
        return F.silu(g) * u

    def norm_gate_up(self, w: torch.Tensor, cfg: TileConfig) -> torch.Tensor:
        return gemm.rms_norm_gate_up(self.x, self.nw, NORM_EPS, w, out=self.out, config=cfg)

    def cutile(self, w: torch.Tensor, cfg: TileConfig) -> torch.Tensor:
        if self.op == "gated":
            return gemm.fused_gate_up_silu(self.x, w, out=self.out, config=cfg)
        if self.op == "residual":
            return gemm.linear_residual(self.x, w, self.r, out=self.out, config=cfg)
        return gemm.linear(self.x, w, out=self.out, config=cfg)

    def error(self, call, reference=None) -> float:
        """Relative error of one call on the first weight against fp32 (NaN-poisoned output);
        ``reference`` (of a weight) for a probe whose op is not the projection's."""
        self.out.fill_(float("nan"))
        got = call(self.ws[0]).float()
        ref = (reference or self.reference)(self.ws[0])
        if not torch.isfinite(got).all():
            return float("inf")
        return ((got - ref).norm() / ref.norm()).item()

    def over_layers(self, call):
        def run() -> None:
            for w in self.ws:
                call(w)

        return run


def bench_projection(model, proj, op, n, k, args, copy, spec) -> list[dict]:
    """The rows of one projection, fastest first (its weights are freed on return)."""
    stream = Stream(op, n, k, args.layers)
    calls = {"cuBLAS": stream.cublas}
    checks = {}  # probes: name -> (the call whose output is checked, its fp32 reference)
    configs_by_name: dict[str, TileConfig] = {}
    for i, cfg in enumerate(configs(op, n, k, args.candidates)):
        name = ("table " if i == 0 else "") + config_name(cfg)
        calls[name] = lambda w, cfg=cfg: stream.cutile(w, cfg)
        configs_by_name[name] = cfg
    if op == "gated" and args.candidates != "table":
        for cfg in NORM_PROBE_TILES:
            name = "probe: norm + " + config_name(cfg)
            calls[name] = lambda w, cfg=cfg: stream.norm_gate_up(w, cfg)
            checks[name] = (calls[name], stream.normed_reference)
    if proj == "qkv" and args.candidates != "table":
        c = MODELS[model]
        stream.set_heads(
            c["q"] // c["head"], c["kv"] // c["head"], c["head"], c.get("qk_norm", False)
        )
        two, one = ROPE_PROBES
        calls[two], calls[one] = stream.norm_then_rope, stream.norm_rope
        checks[two] = (stream.norm_then_rope_joined, stream.rope_reference)
        checks[one] = (stream.norm_rope, stream.rope_reference)
        for cfg in ROPE_PROBE_TILES:
            name = f"{one} {config_name(cfg)}"
            calls[name] = lambda w, cfg=cfg: stream.norm_rope(w, cfg)
            checks[name] = (calls[name], stream.rope_reference)
    good = {}
    for name, call in calls.items():
        try:
            err = stream.error(*checks.get(name, (call, None)))
        except Exception as exc:  # a config that does not compile or launch is reported, skipped
            print(f"# FAILED {model} {proj} {name}: {type(exc).__name__}: {exc}", flush=True)
            continue
        if err > 1e-2:
            print(f"# WRONG RESULT {model} {proj} {name}: rel err {err:.2e}", flush=True)
            continue
        good[name] = stream.over_layers(call)
    times = interleaved_graphs(good, calls=1, replays=args.replays)
    records = []
    for name, (med, lo, hi) in sorted(times.items(), key=lambda kv: kv[1][0]):
        us = med / args.layers
        tbps = stream.nbytes / (us * 1e-6) / 1e12
        records.append(
            dict(
                model=model,
                proj=proj,
                op=op,
                N=n,
                K=k,
                variant=name,
                us=us,
                min_us=lo / args.layers,
                max_us=hi / args.layers,
                tbps=tbps,
                pct_copy=100 * tbps / copy,
                pct_spec=100 * tbps / spec,
                config=configs_by_name.get(name),
            )
        )
    return records


def winner(records: list[dict]) -> TileConfig | None:
    """The fastest cuTile config of one projection's rows (fastest first) when it beats the
    table's choice beyond the replays' spread (its max below the table's min), else None."""
    table = next((r for r in records if r["variant"].startswith("table ")), None)
    best = next((r for r in records if r["config"] is not None), None)
    if table is None or best is None or best is table or best["max_us"] >= table["min_us"]:
        return None
    return best["config"]


def tuned_table(records: list[dict]) -> dict[str, list]:
    """The shipped tile table with every projection's `winner` in place."""
    doc = table_doc()
    by_proj: dict[tuple, list[dict]] = {}
    for r in records:
        by_proj.setdefault((r["model"], r["proj"], r["N"], r["K"], r["op"]), []).append(r)
    for (_, _, n, k, op), rows in by_proj.items():
        cfg = winner(rows)
        if cfg is not None:
            doc[f"{m_bucket(1)}|{n}|{k}|{op == 'gated'}"] = table_entry(cfg)
    return doc


def _write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def row(r: dict) -> list[object]:
    return [
        r["model"],
        r["proj"],
        r["N"],
        r["K"],
        r["variant"],
        round(r["us"], 2),
        f"{r['min_us']:.2f}-{r['max_us']:.2f}",
        round(r["tbps"], 2),
        round(r["pct_copy"], 1),
        round(r["pct_spec"], 1),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="olmo3")
    p.add_argument("--projs", default="qkv,o_proj,gate_up,down")
    p.add_argument("--layers", type=int, default=32, help="weights (calls) a graph")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--candidates", choices=("table", "gemv", "all"), default="gemv")
    p.add_argument("--tbps", type=float, default=None, help="spec HBM TB/s of an unlisted GPU")
    p.add_argument("--json-out", default=None)
    p.add_argument("--tuned-out", default=None, help="the tile table with the winners in place")
    args = p.parse_args(argv)
    bad = [m for m in args.models.split(",") if m not in MODELS]
    bad += [f"projection {x!r}" for x in args.projs.split(",") if x not in PROJECTIONS]
    if bad:
        print(
            f"error: unknown {', '.join(bad)} (models: {', '.join(MODELS)}; "
            f"projections: {', '.join(PROJECTIONS)})",
            file=sys.stderr,
        )
        return 2
    if not torch.cuda.is_available():
        print("error: bench_gemv_stream.py needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        spec, name = (args.tbps, torch.cuda.get_device_name()) if args.tbps else running_gpu_tbps()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    copy = copy_tbps()
    print(f"# {name}: copy {copy:.2f} TB/s, spec {spec:.2f} TB/s; {args.layers} weights a graph")
    records = []
    for model in args.models.split(","):
        projs = projections(model)
        for proj in args.projs.split(","):
            op, n, k = projs[proj]
            got = bench_projection(model, proj, op, n, k, args, copy, spec)
            records += got
            print(format_table(HEADER, [row(r) for r in got]), flush=True)
            torch.cuda.empty_cache()
    if args.json_out:
        rows = [{**r, "config": r["config"] and table_entry(r["config"])} for r in records]
        doc = dict(gpu=name, copy_tbps=copy, spec_tbps=spec, rows=rows)
        _write(args.json_out, json.dumps(doc, indent=1))
    if args.tuned_out:
        _write(args.tuned_out, table_text(tuned_table(records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
