"""cuTile GEMMs (linear, linear + residual, fused gate-up + SiLU) against fp32 references.

GPU tests cover every projection of the qwen3, llama and phi3 models at decode and prefill token
counts (lm_head included), odd M/N/K with and without bias, explicit split-K, and NaN-poisoned
outputs. The CPU tests cover the tile-table policy and the AOT signatures.
"""

from __future__ import annotations

import io
import json
import math

import cuda.tile as ct
import pytest
import torch
from bench_scripts import load_bench
from cubin_ptx import global_accesses, instructions, ptx_lines

from tilegym.ops import gemm_configs
from tilegym.ops.gemm_configs import TileConfig, candidate_configs, choose_config
from tilegym.ops.testing import assert_close_rel

#: one bf16 rounding of an fp32-accumulated result: about 2.3e-3 relative (Frobenius)
GEMM_TOL = {torch.bfloat16: 8e-3, torch.float16: 2e-3}

MODELS = {
    "qwen3": dict(hidden=1024, q=16 * 128, kv=8 * 128, inter=3072, vocab=151936),
    "llama": dict(hidden=2048, q=32 * 64, kv=8 * 64, inter=8192, vocab=128256),
    "phi3": dict(hidden=3072, q=32 * 96, kv=32 * 96, inter=8192, vocab=32064),
}
#: models whose checkpoints pack q/k/v and gate/up: q_proj, k_proj and gate_proj never run alone
PACKED = {"phi3"}
#: the tile table's buckets per model, where it holds only some (phi3: the one-row decode GEMMs
#: measured in the model; other token counts take the bucket defaults)
TABLE_BUCKETS = {"phi3": {"single"}}


def projections(model: str) -> dict[str, tuple[str, int, int]]:
    """name -> (op, N, K); op is 'linear', 'residual' or 'gated' (N = intermediate size)."""
    c = MODELS[model]
    h = c["hidden"]
    return {
        "q_proj": ("linear", c["q"], h),
        "k_proj": ("linear", c["kv"], h),
        "qkv_proj": ("linear", c["q"] + 2 * c["kv"], h),
        "o_proj": ("residual", h, c["q"]),
        "gate_proj": ("linear", c["inter"], h),
        "gate_up_silu": ("gated", c["inter"], h),
        "down_proj": ("residual", h, c["inter"]),
        "lm_head": ("linear", c["vocab"], h),
    }


def _rand(shape, gen, dtype, scale=1.0):
    return (torch.randn(shape, device="cuda", generator=gen) * scale).to(dtype)


def _run_case(op, m, n, k, gen, dtype=torch.bfloat16, bias=False, config=None, lead=()):
    """Run one op on fresh random inputs into a NaN-poisoned output; check against fp32."""
    from tilegym.ops import gemm

    x = _rand((*lead, m, k), gen, dtype)
    rows = 2 * n if op == "gated" else n
    w = _rand((rows, k), gen, dtype, 1 / math.sqrt(k))
    out = torch.full((*lead, m, n), float("nan"), device="cuda", dtype=dtype)
    xf, wf = x.float(), w.float()
    if op == "gated":
        res = gemm.fused_gate_up_silu(x, w, out=out, config=config)
        g, u = torch.nn.functional.linear(xf, wf).split(n, dim=-1)
        ref = torch.nn.functional.silu(g) * u
    elif op == "residual":
        r = _rand((*lead, m, n), gen, dtype)
        res = gemm.linear_residual(x, w, r, out=out, config=config)
        ref = r.float() + torch.nn.functional.linear(xf, wf)
    else:
        b = _rand((n,), gen, dtype) if bias else None
        res = gemm.linear(x, w, b, out=out, config=config)
        ref = torch.nn.functional.linear(xf, wf, None if b is None else b.float())
    assert res.data_ptr() == out.data_ptr()
    assert_close_rel(out, ref, tol=GEMM_TOL[dtype])


CASES = [
    (model, name, m)
    for model in MODELS
    for name in projections(model)
    for m in (1, 16, 32, 300, 2048)
    if not (name == "lm_head" and m in (16, 32, 300))
]


@pytest.mark.gpu
@pytest.mark.parametrize("model,name,m", CASES)
def test_model_projection(model, name, m, gen):
    op, n, k = projections(model)[name]
    _run_case(op, m, n, k, gen)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 17, 1000, 2049])
@pytest.mark.parametrize("n", [1000, 2048])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_odd_shapes(m, n, bias, gen):
    _run_case("linear", m, n, 1000, gen, bias=bias)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [3, 17, 2049])
@pytest.mark.parametrize("op", ["residual", "gated"])
def test_fused_epilogues_odd_shapes(op, m, gen):
    _run_case(op, m, 1000, 1000, gen)


@pytest.mark.gpu
@pytest.mark.parametrize("reduce", ["cta", "pdl"])
@pytest.mark.parametrize("op", ["linear", "residual", "gated"])
@pytest.mark.parametrize("split", [2, 5, 16])
def test_split_k_odd_shapes_twice(op, split, reduce, gen):
    """Split-K with uneven and empty K shares; a second call proves the counters reset."""
    cfg = TileConfig(16, 64, 128, split, reduce=reduce)
    for _ in range(2):
        _run_case(op, 3, 1000, 1000, gen, config=cfg)


#: tile shapes whose last-CTA split-K sum read stale partials on the H200 before the partials
#: bypassed TMA (llama gate/up shapes, rel err 0.1-0.4), and the narrow decode tiles
SPLIT_STRESS = [
    ("linear", 8192, 2048, TileConfig(16, 128, 256, 5)),
    ("linear", 16384, 2048, TileConfig(16, 128, 256, 3)),
    ("gated", 8192, 2048, TileConfig(16, 128, 128, 5)),
    ("residual", 2048, 8192, TileConfig(16, 64, 128, 5)),
    ("linear", 512, 2048, TileConfig(16, 16, 256, 4)),
    ("gated", 3072, 1024, TileConfig(16, 32, 256, 2)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("reduce", ["cta", "pdl"])
@pytest.mark.parametrize("op,n,k,cfg", SPLIT_STRESS)
def test_split_k_repeated_model_shapes(op, n, k, cfg, reduce, gen):
    """Each split-K reduction, many calls at decode token counts on fresh inputs: an ordering
    race between the partial stores and their sum shows up as a wrong result in some call."""
    cfg = TileConfig(cfg.tm, cfg.tn, cfg.tk, cfg.split, reduce=reduce)
    for m in (1, 8, 16, 5, 1, 16):
        _run_case(op, m, n, k, gen, config=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["linear", "residual"])
@pytest.mark.parametrize("occupancy", [1, 2])
def test_persistent_odd_and_model_shapes(op, occupancy, gen):
    """The persistent kernel: fewer blocks than tiles (odd M/N/K), and a qwen3 prefill shape."""
    cfg = TileConfig(128, 128, 64, occupancy=occupancy, persistent=True)
    for m, n, k in ((2049, 1000, 1000), (300, 4096, 1024), (2048, 3072, 1024)):
        _run_case(op, m, n, k, gen, config=cfg, bias=op == "linear")
    small = TileConfig(16, 128, 128, occupancy=occupancy, persistent=True)  # decode tiles
    for m, n, k in ((1, 1000, 1000), (9, 151936, 1024), (16, 2048, 8192)):
        _run_case(op, m, n, k, gen, config=small, bias=op == "linear")
    with pytest.raises(ValueError, match="persistent"):
        _run_case("gated", 64, 256, 256, gen, config=cfg)


GEMV_CONFIGS = [
    TileConfig(1, 8, 1024, gemv=True),
    TileConfig(4, 16, 256, gemv=True),
    TileConfig(1, 4, 2048, gemv=True, latency=4),
    TileConfig(16, 4, 256, gemv=True),
    # products kept over K steps, reduced once (TM * TN * TK <= GEMV_ACC_ELEMS)
    TileConfig(1, 4, 1024, gemv=True),
    TileConfig(1, 2, 512, gemv=True, latency=1),
    TileConfig(4, 8, 128, gemv=True),
    # blocks-per-SM hints that cap the registers (`GEMV_OCCUPANCY_TILES`)
    TileConfig(1, 4, 2048, gemv=True, occupancy=8),
    TileConfig(1, 4, 1024, gemv=True, occupancy=6),
]


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["linear", "residual", "gated"])
@pytest.mark.parametrize(
    "cfg", GEMV_CONFIGS, ids=lambda c: f"{c.tm}x{c.tn}x{c.tk}L{c.latency}O{c.occupancy}"
)
def test_gemv_odd_and_model_shapes(op, cfg, gen):
    """The GEMV kernels (plain and gate/up): M, N, K not multiples of its tiles (K < TK,
    K = 1000-ish), bias, a residual, decode shapes of both models; outputs poisoned."""
    for m, n, k in ((1, 1000, 1000), (3, 2048, 1000), (16, 1021, 3000), (5, 151936, 1024)):
        _run_case(op, m, n, k, gen, config=cfg, bias=op == "linear")


def _op_into(op: str, x, src, w, b, r, out, cfg):
    """``op`` ("linear" with bias ``b``, "residual" adding ``r``, "gated") of ``x`` into ``out``."""
    from tilegym.ops import gemm

    if op == "gated":
        return gemm.fused_gate_up_silu(x, w, out=out, config=cfg)
    if op == "residual":
        return gemm.linear_residual(x, w, r, out=out, config=cfg)
    return gemm.linear(x, w, b, out=out, config=cfg)


def _op_ref(op: str, src, w, b, r):
    """``op`` of ``src`` in fp32."""
    if op == "gated":
        g, u = torch.nn.functional.linear(src.float(), w.float()).chunk(2, dim=-1)
        return torch.nn.functional.silu(g) * u
    if op == "residual":
        return r.float() + torch.nn.functional.linear(src.float(), w.float())
    return torch.nn.functional.linear(src.float(), w.float(), b.float())


@ct.kernel
def _copy_late(src, dst, rounds: int, TILE: ct.Constant[int]):
    """dst = src, stored after `rounds` dependent multiply-adds (each leaves the value as it
    is); each block first lets a programmatic dependent of this kernel start."""
    ct.grid_dependency_control_launch_dependents()
    t = ct.load(src, (0, ct.bid(0)), (1, TILE), padding_mode=ct.PaddingMode.ZERO)
    half = t.astype(ct.float32) * 0.5
    acc = t.astype(ct.float32)
    for _ in range(rounds):
        acc = acc * 0.5 + half
    ct.store(dst, (0, ct.bid(0)), acc.astype(dst.dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["linear", "residual", "gated"])
@pytest.mark.parametrize(
    "cfg",
    [TileConfig(1, 4, 1024, gemv=True), TileConfig(1, 8, 1024, gemv=True)],
    ids=["sum_last", "sum_each"],  # TM * TN * TK <= GEMV_ACC_ELEMS or not
)
def test_gemv_pdl_waits_for_the_kernel_writing_x(op, cfg, gen, monkeypatch):
    """`GEMV_PDL` on: the GEMV starts while the kernel before it in the stream (which lets it
    start at once) still computes X; it must read X, bias and residual only after its wait.
    One row, odd N, fresh inputs, outputs poisoned; a first call compiles and warms up. The
    same launch without the wait reads X's NaN poison: the test can see a missed wait."""
    from tilegym.ops import gemm
    from tilegym.ops._common import stream

    monkeypatch.setattr(gemm, "GEMV_PDL", True)
    dt = torch.bfloat16

    def write_late(src, x):  # x = src, stored some 100 us (2^17 dependent fp32 fmas) late
        grid = (math.ceil(src.shape[1] / 1024), 1, 1)
        ct.launch(stream(), grid, _copy_late, (src, x, 1 << 17, 1024))

    # the first call compiles (X is written by then); the others start while X is computed
    for n, k in ((1021, 3000), (1021, 3000), (2047, 1000), (5, 1024)):
        src = _rand((1, k), gen, dt)
        w = _rand((2 * n if op == "gated" else n, k), gen, dt, 1 / math.sqrt(k))
        b = _rand((n,), gen, dt) if op == "linear" else None
        r = _rand((1, n), gen, dt) if op == "residual" else None
        if op == "gated":  # W's first read, without PDL (`_pdl_ready`)
            gemm.fused_gate_up_silu(src, w, config=cfg)
        else:
            gemm.linear(src, w, b, config=cfg)
        x = torch.full_like(src, float("nan"))
        out = torch.full((1, n), float("nan"), device="cuda", dtype=dt)
        write_late(src, x)
        assert_close_rel(
            _op_into(op, x, src, w, b, r, out, cfg), _op_ref(op, src, w, b, r), tol=GEMM_TOL[dt]
        )
    if op == "gated":  # the no-wait control below is the plain GEMV's
        return
    args = (*gemm._io_args(x, w, b, r, out), cfg.tm, cfg.tn, cfg.tk, gemm.GEMV_LATENCY)
    args += (b is not None, r is not None, False)  # PDL=False: no wait in the kernel
    grid = (math.ceil(n / cfg.tn), 1, 1)
    for poison in (False, True):  # the first launch compiles the kernel without the wait
        if poison:
            x.fill_(float("nan"))
            write_late(src, x)
        ct.launch(
            stream(), grid, gemm.tilegym_gemv_kernel, args, programmatic_dependent_launch=True
        )
    assert out.isnan().all(), "without its wait the GEMV still read X after it was written"


#: mma tiles `MMA_PDL` launches: unsplit swapped (decode), both split reductions, unswapped
MMA_PDL_CONFIGS = [
    TileConfig(8, 64, 256, swap=True, stagger=True),
    TileConfig(16, 64, 128, 5, reduce="pdl", swap=True),
    TileConfig(16, 64, 128, 3, reduce="cta"),
    TileConfig(16, 64, 64),
]


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["linear", "residual", "gated"])
@pytest.mark.parametrize(
    "cfg", MMA_PDL_CONFIGS, ids=lambda c: f"{c.tm}x{c.tn}x{c.tk}s{c.split}{c.reduce}"
)
def test_mma_pdl_waits_for_the_kernel_writing_x(op, cfg, gen, monkeypatch):
    """`MMA_PDL` "dependent": the mma GEMM is placed while the kernel before it (which lets it
    start at once) still computes X, and must read X, bias and residual and write its
    workspace only after its wait. Odd M, N and K, fresh inputs, outputs poisoned; the first
    call compiles and warms up."""
    from tilegym.ops import gemm
    from tilegym.ops._common import stream

    monkeypatch.setattr(gemm, "MMA_PDL", "dependent")
    dt = torch.bfloat16
    for m, n, k in ((1, 1000, 1000), (3, 2047, 3000), (16, 1021, 1000)):
        src = _rand((m, k), gen, dt)
        w = _rand((2 * n if op == "gated" else n, k), gen, dt, 1 / math.sqrt(k))
        b = _rand((n,), gen, dt) if op == "linear" else None
        r = _rand((m, n), gen, dt) if op == "residual" else None
        grid = (math.ceil(k / 1024), 1, 1)
        for _ in range(2):
            x = torch.full_like(src, float("nan"))
            out = torch.full((m, n), float("nan"), device="cuda", dtype=dt)
            for row in range(m):  # x = src, each row stored some 100 us late
                args = (src[row : row + 1], x[row : row + 1], 1 << 17, 1024)
                ct.launch(stream(), grid, _copy_late, args)
            got = _op_into(op, x, src, w, b, r, out, cfg)
            assert_close_rel(got, _op_ref(op, src, w, b, r), tol=GEMM_TOL[dt])


def test_mma_pdl_refuses_an_unknown_mode(monkeypatch):
    from tilegym.ops import gemm

    monkeypatch.setattr(gemm, "MMA_PDL", True)
    x, w = torch.ones(1, 64), torch.ones(64, 64)
    with pytest.raises(ValueError, match="MMA_PDL True is none of"):
        gemm._launch_mma(None, TileConfig(8, 64, 64, swap=True), (1, 1, 1), (x, w), x.device)


@pytest.mark.slow
def test_mma_pdl_waits_before_every_global_access():
    """sm_90 PTX of the mma kernels at the aligned AOT signatures with PDL: this launch lets
    its dependents start and then waits, before any global load, TMA copy, store or atomic;
    without PDL there is no `griddepcontrol` at all."""
    from tilegym.ops import gemm

    kernels = (gemm.tilegym_linear_kernel, gemm.tilegym_gate_up_silu_kernel)
    sigs = gemm.aot_signatures(("residual", "gated"), (torch.bfloat16,))
    checked = {True: 0, False: 0}
    for kernel, entries in sigs.items():
        if kernel not in kernels:
            continue
        for sig in entries:
            if sig.parameters[0].base_addr_divisible_by != 16:
                continue
            pdl = sig.parameters[-1].value
            lines = ptx_lines(kernel, sig)
            if not pdl:
                assert not any("griddepcontrol" in line for line in lines)
                checked[False] += 1
                continue
            (trigger,) = instructions(lines, "griddepcontrol.launch_dependents")
            (wait,) = instructions(lines, "griddepcontrol.wait")
            accesses = global_accesses(lines)
            assert trigger < wait and accesses and min(a.line for a in accesses) > wait
            checked[True] += 1
    assert checked[True] >= 4 and checked[False] >= 4, checked


SWAP_CONFIGS = [
    TileConfig(8, 64, 128, swap=True),
    TileConfig(16, 64, 256, swap=True, transpose_tile=False),
    TileConfig(16, 64, 128, 5, reduce="pdl", occupancy=2, swap=True),
    TileConfig(8, 128, 128, 8, reduce="pdl", swap=True),
    TileConfig(16, 128, 128, occupancy=1, persistent=True, swap=True),
    # K order staggered per N tile (`gemm._k_tile`): unsplit, uneven and empty split shares,
    # the persistent loop, and an unswapped tile with the last-CTA sum
    TileConfig(8, 64, 256, swap=True, stagger=True),
    TileConfig(16, 64, 128, 5, reduce="pdl", swap=True, stagger=True),
    TileConfig(16, 128, 128, occupancy=1, persistent=True, swap=True, stagger=True),
    TileConfig(16, 64, 128, 3, reduce="cta", stagger=True),
    # the small bucket's swapped tiles: 32/64 token columns (prefill of short prompts)
    TileConfig(32, 64, 256, swap=True),
    TileConfig(64, 128, 128, swap=True, transpose_tile=False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["linear", "residual", "gated"])
@pytest.mark.parametrize(
    "cfg", SWAP_CONFIGS, ids=lambda c: f"{c.tm}x{c.tn}x{c.tk}s{c.split}{'S' if c.stagger else ''}"
)
def test_swapped_operands_odd_and_model_shapes(op, cfg, gen):
    """W as the mma's A operand (acc transposed into the output): M below, at and above the
    token tile (several M tiles), N and K off the tiles, uneven split shares, bias, both
    fused epilogues, decode shapes of both models; outputs poisoned, two calls per shape."""
    if op == "gated" and cfg.persistent:
        with pytest.raises(ValueError, match="persistent"):
            _run_case(op, 1, 256, 256, gen, config=cfg)
        return
    shapes = [(1, 1000, 1000), (3, 2048, 1000), (20, 1021, 3000), (16, 2048, 8192)]
    shapes.append((8, 1024, 3072) if op == "gated" else (9, 151936, 1024))
    if cfg.tm >= 32:
        shapes += [(100, 1000, 1000), (77, 2048, 2048)]
    for m, n, k in shapes:
        for _ in range(2):
            _run_case(op, m, n, k, gen, config=cfg, bias=op == "linear")


@pytest.mark.gpu
def test_fp16_and_batched_input(gen):
    _run_case("linear", 5, 1024, 2048, gen, dtype=torch.float16, lead=(2,))
    _run_case("gated", 33, 512, 1024, gen, lead=(3,))


@pytest.mark.gpu
def test_allocated_output_is_fully_written(gen, poison_empty):
    """Without `out=`, outputs and the split-K workspace come from NaN-poisoned torch.empty."""
    from tilegym.ops import gemm

    for m in (1, 300):
        x = _rand((m, 1024), gen, torch.bfloat16)
        w = _rand((2 * 3072, 1024), gen, torch.bfloat16, 1 / 32)
        ref = torch.nn.functional.linear(x.float(), w.float())
        assert_close_rel(gemm.linear(x, w), ref, tol=GEMM_TOL[torch.bfloat16])
        g, u = ref.split(3072, dim=-1)
        act = torch.nn.functional.silu(g) * u
        assert_close_rel(gemm.fused_gate_up_silu(x, w), act, tol=GEMM_TOL[torch.bfloat16])


@pytest.mark.gpu
def test_zero_output_fails_the_check(gen):
    x = _rand((4, 256), gen, torch.bfloat16)
    w = _rand((128, 256), gen, torch.bfloat16)
    ref = torch.nn.functional.linear(x.float(), w.float())
    with pytest.raises(AssertionError, match="relative error"):
        assert_close_rel(torch.zeros_like(ref, dtype=torch.bfloat16), ref, tol=8e-3)


def test_zero_output_fails_the_check_cpu():
    ref = torch.randn(16, 64) @ torch.randn(64, 32)
    with pytest.raises(AssertionError, match="relative error"):
        assert_close_rel(torch.zeros_like(ref, dtype=torch.bfloat16), ref, tol=8e-3)
    assert_close_rel(ref.to(torch.bfloat16), ref, tol=8e-3)


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("m", [1, 8, 16, 17, 100, 300, 1024, 2048, 5000])
def test_configs_cover_model_shapes(model, m):
    """Every model projection has a config (split only at decode); the measured table covers
    the decode and prefill buckets of every projection shape."""
    for name, (op, n, k) in projections(model).items():
        gated = op == "gated"
        cfg = choose_config(m, n, k, gated=gated)
        assert cfg.split == 1 or gemm_configs.m_bucket(m) in gemm_configs.DECODE_BUCKETS
        assert not cfg.gemv or (m <= gemm_configs.DECODE_MAX_M and not gated)
        assert not cfg.swap or m <= gemm_configs.SMALL_MAX_M
        bucket = gemm_configs.m_bucket(m)
        if model in PACKED and name in ("q_proj", "k_proj", "gate_proj"):
            continue
        if bucket not in TABLE_BUCKETS.get(model, {bucket}):
            continue
        if bucket in gemm_configs.MID_BUCKETS and name in ("q_proj", "k_proj", "gate_proj"):
            continue  # prefill of the patched model runs them packed (qkv_proj, gate_up)
        if bucket in gemm_configs.MID_BUCKETS and name == "lm_head":
            continue  # generate() runs it on the last token only
        if gemm_configs.TILE_TABLE.exists():
            assert (bucket, n, k, gated) in gemm_configs.TUNED, (model, op, n, k)


def test_m_buckets_split_decode_at_eight_tokens():
    expected = {1: "single", 2: "decode", 8: "decode", 9: "decode16", 16: "decode16"}
    expected.update({17: "small", 128: "small", 129: "medium", 1024: "medium", 1025: "large"})
    assert {m: gemm_configs.m_bucket(m) for m in expected} == expected
    with pytest.raises(ValueError):
        gemm_configs.m_bucket(0)


def test_defaults_outside_the_table():
    cfg = choose_config(3, 1000, 1000)
    assert (cfg.tm, cfg.split, cfg.swap) == (8, 1, True)
    assert choose_config(5000, 1000, 1000).tm == 128
    assert (choose_config(40, 1000, 1000, gated=True).tm, choose_config(40, 8, 8).swap) == (
        32,
        True,
    )
    assert choose_config(300, 1000, 1000) == TileConfig(64, 128, 64)


def test_tile_config_validation_and_candidates():
    with pytest.raises(ValueError):
        TileConfig(24, 64, 64)
    with pytest.raises(ValueError):
        TileConfig(16, 64, 64, split=0)
    with pytest.raises(ValueError):
        choose_config(0, 64, 64)
    with pytest.raises(ValueError, match="reduce"):
        TileConfig(16, 64, 64, split=2, reduce="atomic")
    cands = candidate_configs(1, 1024, 1024)
    assert cands[0] == choose_config(1, 1024, 1024)
    assert len(set(cands)) == len(cands)
    split = [c for c in cands if c.split > 1]
    assert {c.reduce for c in split} == {"cta", "pdl"}
    assert {c.tn for c in cands} >= {16, 32, 64, 128}
    assert all(c.split == 1 for c in candidate_configs(2048, 1024, 1024))
    # lm_head: its N tiles alone fill the GPU, so no split is tried
    assert all(c.split == 1 for c in candidate_configs(1, 151936, 1024)[1:])
    gemv = [c for c in cands if c.gemv]
    assert gemv and all(c.tm == 1 and c.tk <= 1024 for c in gemv)  # M = 1, K = 1024
    assert not any(c.gemv for c in candidate_configs(16, 1024, 1024))  # GEMV only at M = 1
    swap = [c for c in candidate_configs(8, 2048, 1024) if c.swap]
    assert {c.tm for c in swap} == {8} and {c.tn for c in swap} == {32, 64, 128}
    assert {c.tm for c in candidate_configs(16, 2048, 1024) if c.swap} == {8, 16}
    # split down to one K tile per split; a second wave of blocks gets an occupancy hint
    assert TileConfig(8, 64, 128, 8, reduce="pdl", occupancy=2, swap=True) in swap
    assert not any(c.split > 1 and c.reduce == "cta" for c in swap)
    assert TileConfig(8, 64, 256, 4, reduce="pdl", swap=True) in swap
    assert TileConfig(8, 128, 128, occupancy=2, swap=True) in swap
    # the persistent loop only where N makes several waves of tiles (lm_head)
    assert not any(c.persistent for c in candidate_configs(8, 2048, 1024))
    assert any(c.persistent and c.swap for c in candidate_configs(16, 151936, 1024))
    assert not any(c.swap for c in candidate_configs(2048, 1024, 1024))
    assert {c.tn for c in candidate_configs(16, 1024, 1024) if c.swap} == {32, 64, 128}
    gated_gemv = [c for c in candidate_configs(1, 1024, 1024, gated=True) if c.gemv]
    assert gated_gemv and all(c.tm == 1 and c.tk <= 1024 for c in gated_gemv)
    assert not any(c.gemv for c in candidate_configs(8, 1024, 1024, gated=True))
    assert any(c.persistent and c.tm == 16 for c in candidate_configs(8, 151936, 1024))
    assert not any(c.persistent for c in candidate_configs(8, 3072, 1024, gated=True))
    # small/medium (batch x short-prompt prefill): small tiles, swapped ones at M <= 128
    mid = candidate_configs(256, 2048, 8192)
    assert TileConfig(64, 64, 64, transpose_tile=False) in mid and not any(c.swap for c in mid)
    assert TileConfig(128, 128, 64, occupancy=1, persistent=True) in mid
    small = candidate_configs(32, 2048, 8192)
    assert {c.tm for c in small if c.swap} == {32, 64}
    assert all(c.split == 1 for c in small + mid + candidate_configs(200, 3072, 1024, gated=True))
    with pytest.raises(ValueError, match="gemv"):
        TileConfig(1, 8, 1024, split=2, gemv=True)
    with pytest.raises(ValueError):
        TileConfig(1, 8, 1024)  # tm < 16 only for gemv (1..) and swap (8..)
    with pytest.raises(ValueError):
        TileConfig(4, 64, 128, swap=True)
    with pytest.raises(ValueError, match="swap"):
        TileConfig(1, 8, 1024, gemv=True, swap=True)
    with pytest.raises(ValueError, match="pdl"):
        TileConfig(16, 64, 128, 4, swap=True)  # the last-CTA sum raced with swapped tiles
    swapped = [8, 64, 128, 4, 0, True, "pdl", 0, 2, False, False, True]
    assert gemm_configs.parse_table({"decode|2048|1024|False": swapped})[
        ("decode", 2048, 1024, False)
    ] == TileConfig(8, 64, 128, 4, reduce="pdl", occupancy=2, swap=True)
    staggered = TileConfig(8, 64, 256, occupancy=2, swap=True, stagger=True)
    doc = {"decode|8192|2048|False": gemm_configs.table_entry(staggered)}
    assert gemm_configs.parse_table(doc)[("decode", 8192, 2048, False)] == staggered
    with pytest.raises(ValueError, match="stagger"):
        TileConfig(1, 8, 1024, gemv=True, stagger=True)


def test_hints_compile_variants_and_uneven_grids_fall_back():
    from tilegym.ops import gemm

    plain = gemm.tilegym_linear_kernel
    assert gemm.hinted(plain, TileConfig(128, 128, 64), 7) is plain
    assert gemm.hinted(plain, TileConfig(128, 128, 64, ctas=2), 7) is plain  # odd grid
    two = gemm.hinted(plain, TileConfig(128, 128, 64, ctas=2), 8)
    assert two is not plain and two is gemm.hinted(plain, TileConfig(16, 16, 16, ctas=2), 2)
    with pytest.raises(ValueError, match="ctas"):
        TileConfig(128, 128, 64, ctas=3)
    with pytest.raises(ValueError, match="persistent"):
        TileConfig(16, 64, 64, split=2, persistent=True)
    table = gemm_configs.parse_table(
        {"large|1024|1024|False": [128, 256, 64, 1, 0, True, "cta", 2, 1]}
    )
    cfg = table[("large", 1024, 1024, False)]
    assert (cfg.ctas, cfg.occupancy) == (2, 1)


def test_split_factors_aim_at_one_or_two_waves():
    assert gemm_configs.split_factors(2048, 8192, 64, 128) == [5, 9]  # 32 tiles, 64 K tiles
    assert gemm_configs.split_factors(1024, 1024, 64, 256) == [2]  # 16 tiles but 4 K tiles
    assert gemm_configs.split_factors(512, 2048, 16, 256) == [4]  # 32 tiles, 8 K tiles
    assert gemm_configs.split_factors(151936, 1024, 128, 128) == []
    assert gemm_configs.split_factors(64, 128, 16, 128) == []  # one K tile: nothing to split


def test_gemv_pdl_only_for_a_weight_read_before_at_its_version(monkeypatch):
    """With `GEMV_PDL` on, a weight's first GEMV (a lazily built weight's builder may be the
    kernel right before) and its first after an in-place write launch without PDL; later
    reads with it. Off, never. A dead weight's record goes with it."""
    import gc

    from tilegym.ops import gemm

    pdl = []

    def launch(_stream, _grid, _kernel, _args, programmatic_dependent_launch=False):
        pdl.append(programmatic_dependent_launch)

    monkeypatch.setattr(gemm.ct, "launch", launch)
    monkeypatch.setattr(gemm, "stream", lambda *a: None)
    monkeypatch.setattr(gemm, "GEMV_PDL", True)
    cfg = TileConfig(1, 4, 1024, gemv=True)
    x, out = torch.randn(1, 64), torch.empty(1, 32)
    w = torch.randn(32, 64)

    def gemv(weight):
        gemm._launch_gemv(x, weight, None, None, out, cfg)

    for _ in range(3):
        gemv(w)
    w.mul_(2)  # written in place: the next read waits first
    gemv(w)
    gemv(w)
    fresh = torch.randn(32, 64)  # a newly built weight
    gemv(fresh)
    gemv(fresh)
    assert pdl == [False, True, True, False, True, False, True]
    key = id(fresh)
    del fresh
    gc.collect()
    assert key not in gemm._GEMV_READ
    with torch.inference_mode():  # no version counter: never early
        built = torch.randn(32, 64)
        gemv(built)
        gemv(built)
    assert pdl[-2:] == [False, False]
    monkeypatch.setattr(gemm, "GEMV_PDL", False)
    gemv(w)
    assert pdl[-1] is False


@pytest.mark.slow
def test_aot_signatures_compile_for_sm90():
    """The declared signatures cover both kernels and one of them compiles on the CPU."""
    from cuda.tile.compilation import export_kernel

    from tilegym.ops import gemm

    sigs = gemm.aot_signatures()
    base = {
        gemm.tilegym_linear_kernel,
        gemm.tilegym_gate_up_silu_kernel,
        gemm.tilegym_splitk_reduce_kernel,
        gemm.tilegym_gemv_kernel,
        gemm.tilegym_gate_up_gemv_kernel,
    }
    occ1 = {  # the occupancy-hinted variants the table launches at prefill
        gemm.hinted(gemm.tilegym_linear_kernel, TileConfig(128, 128, 64, occupancy=1), 1),
        gemm.hinted(gemm.tilegym_gate_up_silu_kernel, TileConfig(128, 64, 64, occupancy=1), 1),
        gemm.hinted(gemm.tilegym_linear_persistent_kernel, TileConfig(16, 16, 16, occupancy=1), 1),
    }
    assert set(sigs) == base | occ1
    assert all(sigs.values())
    gemv_pdl = [sig.parameters[-1].value for sig in sigs[gemm.tilegym_gemv_kernel]]
    assert gemv_pdl.count(False) == gemv_pdl.count(True) > 0  # the GEMV_PDL constant, both ways
    gated_pdl = [sig.parameters[-1].value for sig in sigs[gemm.tilegym_gate_up_gemv_kernel]]
    assert gated_pdl.count(False) == gated_pdl.count(True) > 0
    buf = io.BytesIO()
    export_kernel(
        gemm.tilegym_linear_kernel,
        [sigs[gemm.tilegym_linear_kernel][0]],
        buf,
        gpu_code="sm_90",
        output_format="cubin",
    )
    assert len(buf.getvalue()) > 1000


@pytest.mark.slow
@pytest.mark.parametrize("step", [1, 8], ids=["any_shape", "by_8"])
@pytest.mark.parametrize("tiles", [(1, 4, 1024), (1, 8, 1024)], ids=["sum_last", "sum_each"])
def test_gemv_pdl_loads_w_before_the_wait_and_x_after(tiles, step):
    """sm_90 PTX of the GEMV kernel with bias and residual for aligned arrays (the AOT
    signature's; `step` 8: last dimensions divisible by 8 too, as in the models, which gives
    16-byte loads): with PDL, the first W tile's loads come before `griddepcontrol.wait` and
    every other global access (X, B, R, Y) after it; without PDL there is no wait."""
    import dataclasses

    from cuda.tile.compilation import KernelSignature

    from tilegym.ops import gemm

    aot = gemm.aot_signatures(("linear",), (torch.bfloat16,))[gemm.tilegym_gemv_kernel]
    (aligned, *_) = [s for s in aot if s.parameters[0].base_addr_divisible_by == 16]
    arrays = [
        dataclasses.replace(a, shape_divisible_by=(1,) * (a.ndim - 1) + (step,))
        for a in aligned.parameters[:5]
    ]
    x, w = 0, 1  # pointer parameters: X, W, B, R, Y

    def ptx(pdl: bool) -> list[str]:
        params = [*arrays, *tiles, gemm.GEMV_LATENCY, True, True, pdl]
        return ptx_lines(
            gemm.tilegym_gemv_kernel, KernelSignature(params, aligned.calling_convention)
        )

    lines = ptx(True)
    (wait,) = instructions(lines, "griddepcontrol.wait")
    accesses = global_accesses(lines)
    before = [a for a in accesses if a.line < wait]
    assert before and all(a.op.startswith("ld.") and a.arrays == {w} for a in before), before
    assert any(a.arrays == {x} for a in accesses if a.line > wait)
    assert not any("griddepcontrol" in line for line in ptx(False))


@pytest.mark.slow
def test_gate_up_gemv_loads_both_weights_before_the_wait_and_x_after():
    """sm_90 PTX of the gate/up GEMV for aligned arrays with 16-byte rows: with PDL both
    weights' first tiles are loaded before `griddepcontrol.wait`, X read and Y written after
    it; without PDL there is no wait."""
    import dataclasses

    from cuda.tile.compilation import KernelSignature

    from tilegym.ops import gemm

    kernel = gemm.tilegym_gate_up_gemv_kernel
    aot = gemm.aot_signatures(("gated",), (torch.bfloat16,))[kernel]
    (aligned, *_) = [s for s in aot if s.parameters[0].base_addr_divisible_by == 16]
    arrays = [dataclasses.replace(a, shape_divisible_by=(1, 8)) for a in aligned.parameters[:4]]
    x, wg, wu, y = 0, 1, 2, 3

    def ptx(pdl: bool) -> list[str]:
        params = [*arrays, 1, 2, 1024, gemm.GEMV_LATENCY, gemm.ACT_SILU, pdl]
        return ptx_lines(kernel, KernelSignature(params, aligned.calling_convention))

    lines = ptx(True)
    (wait,) = instructions(lines, "griddepcontrol.wait")
    accesses = global_accesses(lines)
    before = [a for a in accesses if a.line < wait]
    assert before and all(a.op.startswith("ld.") and a.arrays <= {wg, wu} for a in before)
    assert {i for a in before for i in a.arrays} == {wg, wu}
    after = [a.arrays for a in accesses if a.line > wait]
    assert {x} in after and {y} in after
    assert not any("griddepcontrol" in line for line in ptx(False))


def _gemv_usages(kernel, op: str, cfg: TileConfig) -> list:
    """sm_90a ptxas usage of a GEMV kernel at ``cfg`` (hints included), one per aligned AOT
    signature of ``op`` (PDL on and off), the arrays' last dimensions multiples of 16 as the
    models' weights are."""
    import dataclasses

    from cubin_ptx import ptxas_usage
    from cuda.tile.compilation import KernelSignature

    from tilegym.ops import gemm

    aot = gemm.aot_signatures((op,), (torch.bfloat16,))[kernel]
    out = []
    for aligned in [s for s in aot if s.parameters[0].base_addr_divisible_by == 16]:
        params = [
            dataclasses.replace(p, shape_divisible_by=(1,) * (p.ndim - 1) + (16,))
            if hasattr(p, "ndim")
            else p
            for p in aligned.parameters
        ]
        at = next(i for i, p in enumerate(params) if not hasattr(p, "ndim"))  # TM, TN, TK
        params[at : at + 3] = [cfg.tm, cfg.tn, cfg.tk]
        signature = KernelSignature(params, aligned.calling_convention)
        out.append(ptxas_usage(ptx_lines(gemm.hinted(kernel, cfg, 1), signature)))
    return out


@pytest.mark.slow
def test_hinted_gemv_candidates_fit_their_register_cap_without_spills():
    """The blocks-per-SM hints the sweeps try (`GEMV_OCCUPANCY_TILES`, the gate/up GEMV's
    hinted tiles) compile to at most 65536 / (128 x hint) registers with no spills; the
    compiler's own choice for the default tile stays above the 8-blocks cap (why the hints)."""
    from tilegym.ops import gemm

    plain = [c for c in gemm_configs.gemv_candidates(1, 4096) if c.occupancy]
    gated = [c for c in gemm_configs.gated_gemv_candidates(4096) if c.occupancy]
    assert len(plain) == len(gemm_configs.GEMV_OCCUPANCY_TILES) and gated
    for kernel, op, cfgs in (
        (gemm.tilegym_gemv_kernel, "linear", plain),
        (gemm.tilegym_gate_up_gemv_kernel, "gated", gated),
    ):
        for cfg in cfgs:
            usages = _gemv_usages(kernel, op, cfg)
            assert len(usages) == 2  # PDL off and on
            for usage in usages:
                assert usage.spill_stores == usage.spill_loads == 0, (cfg, usage)
                assert usage.registers <= 65536 // (128 * cfg.occupancy), (cfg, usage)
    default = TileConfig(1, 4, 1024, gemv=True)
    assert all(u.registers > 64 for u in _gemv_usages(gemm.tilegym_gemv_kernel, "linear", default))


@pytest.mark.parametrize("named", ["missing.json", ""])
def test_a_tile_table_the_environment_names_must_exist(tmp_path, named):
    """TILEGYM_GEMM_TILES naming no file stops the process at import with one line naming it
    and no traceback (it used to load as an empty table: every GEMM at its default config);
    unset or empty, the shipped table loads."""
    import os
    import subprocess
    import sys

    path = str(tmp_path / named) if named else ""
    env = {**os.environ, "TILEGYM_GEMM_TILES": path}
    code = "from tilegym.ops import gemm_configs as g; print(len(g.TUNED))"
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    if named:
        assert run.returncode == 1
        assert run.stderr == f"error: TILEGYM_GEMM_TILES={path}: no such tile table\n"
    else:
        assert run.returncode == 0 and int(run.stdout) == len(gemm_configs.TUNED) > 0


def test_tile_table_parses_and_rejects_bad_keys():
    table = gemm_configs.parse_table({"decode|1024|2048|False": [16, 64, 256, 8, 10, True]})
    cfg = table[("decode", 1024, 2048, False)]
    assert (cfg.tm, cfg.tn, cfg.tk, cfg.split, cfg.latency, cfg.transpose_tile) == (
        16,
        64,
        256,
        8,
        10,
        True,
    )
    gemv = [1, 4, 2048, 1, 0, True, "cta", 0, 0, False, True]
    assert gemm_configs.parse_table({"single|512|2048|False": gemv})[
        ("single", 512, 2048, False)
    ] == TileConfig(1, 4, 2048, gemv=True)
    pdl = gemm_configs.parse_table({"decode|512|2048|True": [16, 16, 256, 4, 0, True, "pdl"]})
    assert pdl[("decode", 512, 2048, True)].reduce == "pdl"
    with pytest.raises(ValueError):
        gemm_configs.parse_table({"huge|1|1|False": [16, 16, 16, 1, 0, True]})
    if gemm_configs.TILE_TABLE.exists():
        assert gemm_configs.TUNED, "the shipped tile table is empty"


def test_bad_inputs_raise_one_clear_error():
    from tilegym.ops import gemm

    x, w = torch.randn(2, 8), torch.randn(4, 8)
    with pytest.raises(ValueError, match="CUDA tensors"):
        gemm.linear(x, w)
    with pytest.raises(ValueError, match="CUDA tensors"):
        gemm.fused_gate_up_silu(x, w)
    with pytest.raises(ValueError, match="CUDA tensors"):
        gemm.linear_residual(x, w, torch.randn(2, 4))


def _bench_script(name: str = "bench_gemm"):
    """benchmarks/ops/<name>.py as a module."""
    return load_bench(name)


def test_bench_tuned_table_is_the_whole_table_with_the_winners():
    bench = _bench_script()
    table = {"large|8|8|False": [128, 128, 64, 1, 0, True], "decode|8|8|False": [16, 32, 256]}
    winners = {"decode|8|8|False": [8, 64, 512, 1, 0, True], "single|8|8|False": [1, 2, 1024]}
    out = bench.merged_table(table, winners)
    assert list(out) == ["large|8|8|False", "decode|8|8|False", "single|8|8|False"]
    assert out["decode|8|8|False"] == [8, 64, 512, 1, 0, True]
    assert table["decode|8|8|False"] == [16, 32, 256]  # the input is not modified
    text = gemm_configs.table_text(out)
    assert json.loads(text) == out and len(text.splitlines()) == len(out) + 2


def test_shortlist_ranks_a_sweeps_configs_per_key_over_all_its_rows():
    """--confirm's input: per (bucket, N, K, gated) the best configs by geometric-mean ratio,
    among those timed on every row of the key (q_proj and o_proj share one here)."""
    bench = _bench_script()
    names = [gemm_configs.config_name(c) for c in candidate_configs(8, 2048, 2048)[:4]]

    def row(proj, cublas, times):
        cands = [[name, us, 1.0] for name, us in zip(names, times, strict=False)]
        return dict(proj=proj, op="linear", M=8, N=2048, K=2048, cublas_us=cublas, candidates=cands)

    doc = {
        "rows": [
            row("q_proj", 10.0, [9.0, 8.0, 12.0, 7.0]),
            row("o_proj", 10.0, [9.0, 11.0, 12.0]),  # the 4th config not timed on this row
            dict(proj="x", op="gated", M=1, N=64, K=64, cublas_us=1.0, candidates=[["?", 1.0, 0]]),
        ]
    }
    short = bench.shortlist(doc, top=2)
    key = ("decode", 2048, 2048, False)
    got = [gemm_configs.config_name(c) for c in short[key]]
    assert got == [names[0], names[1]]  # 0.9 < 0.938 < 1.2
    assert short[("single", 64, 64, True)] == []  # an unknown config name is dropped


def test_bench_confirm_rejects_bad_input(tmp_path, capsys):
    bench = _bench_script()
    assert bench.main(["--confirm", str(tmp_path / "missing.json")]) == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert bench.main(["--confirm", str(bad)]) == 2
    assert bench.main(["--confirm", str(bad), "--sweep"]) == 2
    assert bench.main(["--top", "0"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 4 and all(line.startswith("error: ") for line in errors)


def test_shipped_tile_table_is_stored_one_entry_per_line():
    text = gemm_configs.TILE_TABLE.read_text()
    assert text == gemm_configs.table_text(json.loads(text))


def test_table_entries_round_trip_through_table_entry():
    """`table_entry` writes what `parse_table` reads: every shipped entry comes back as stored."""
    doc = gemm_configs.table_doc()
    for key, cfg in gemm_configs.parse_table(doc).items():
        assert gemm_configs.table_entry(cfg) == doc["|".join(map(str, key))]


def test_bench_summary_splits_one_row_from_decode():
    """bench_gemm's summary judges M = 1 (GEMV bucket) and M = 2..16 separately."""
    bench = _bench_script()

    def rec(m, pct, op="linear", proj="q_proj"):
        return dict(model="qwen3", proj=proj, op=op, M=m, pct_of_cublas=pct)

    lines = bench.summary(
        [
            rec(1, 130.0),
            rec(1, 93.0, proj="lm_head"),
            rec(8, 101.0),
            rec(16, 88.5, proj="o"),
            rec(2048, 95.0),
            rec(1, 150.0, op="gated"),
        ]
    )
    assert lines[0].startswith("prefill: 1/1 rows >= 90%")
    assert lines[1] == "one row (M=1): 1/2 rows >= 100% of cuBLAS; worst 93.0% (qwen3 lm_head M=1)"
    assert lines[2] == "decode (M 2-16): 1/2 rows >= 100% of cuBLAS; worst 88.5% (qwen3 o M=16)"
    assert lines[3] == "fused epilogues faster than the torch pair: 1/1 rows"


def test_in_model_bench_rows_pair_the_two_sides_per_call():
    """bench_gemm_in_model: labels round-trip, rows need both sides, medians per call, decode
    summary over M <= 16 only."""
    mod = _bench_script("bench_gemm_in_model")
    dec = mod.label("linear", 8, 16384, 2048)
    pre = mod.label("linear_residual", 256, 2048, 8192)
    assert (mod.label_rows(dec), mod.label_rows(pre)) == (8, 256)
    assert mod.label_rows("aten::mm") is None and mod.label_rows("linear M=x 1x1") is None
    times = {
        pre: {"cublas": [20.0, 22.0, 21.0], "cutile": [40.0, 42.0, 41.0]},
        dec: {"cublas": [18.0, 19.0, 18.5], "cutile": [17.0, 18.0, 17.5]},
        mod.label("linear", 1, 64, 64): {"cutile": [1.0]},  # one side only: no row
    }
    rows = mod.table_rows("llama", 8, times)
    assert [r[2] for r in rows] == [dec, pre]
    assert rows[0][3:6] == [3, 18.5, 17.5] and abs(rows[0][6] - 100 * 18.5 / 17.5) < 1e-9
    decode, prefill = mod.summary(rows)
    assert decode.startswith("decode calls (M <= 16) >= 100% of cuBLAS: 1/1; worst 105.7%")
    assert prefill == "no prefill calls (M >= 2048) timed"
    big = mod.label("linear", 2048, 16384, 2048)
    rows += mod.table_rows("llama", 1, {big: {"cublas": [90.0], "cutile": [100.0]}})
    assert mod.summary(rows)[1] == (
        f"prefill calls (M >= 2048) >= 90% of cuBLAS: 1/1; worst 90.0% (llama batch 1 {big})"
    )
    assert mod.summary(rows[1:2])[0] == "no decode calls (M <= 16) timed"


def test_in_model_bench_sums_the_kernels_inside_each_calls_gpu_span():
    """A call's time is its stream's kernels inside its GPU span: gaps between a torch pair's
    GEMM and add are not counted, nor kernels of another stream or outside every span."""
    mod = _bench_script("bench_gemm_in_model")
    a, b = mod.label("linear_residual", 8, 2048, 2048), mod.label("linear", 8, 64, 64)
    spans = [(a, 7, 100.0, 130.0), (b, 7, 200.0, 205.0), (a, 7, 300.0, 310.0), (b, 7, 400.0, 401.0)]
    kernels = [
        (7, 101.0, 111.0),  # GEMM of call 1
        (7, 125.0, 129.0),  # its add, after 14 us waiting for the host
        (9, 102.0, 120.0),  # another stream
        (7, 150.0, 160.0),  # between calls
        (7, 200.5, 204.5),
        (7, 300.0, 310.0),
    ]
    times, empty = mod.per_call_kernel_us(spans, kernels)
    assert times == {a: [14.0, 10.0], b: [4.0]} and empty == 1


def test_in_model_tuning_picks_each_keys_fastest_config_by_geometric_mean():
    """--candidates: calls map to table keys (gated N = intermediate), a candidate side counts
    for a key only up to the key's shortlist length, and only calls timed on every side."""
    mod = _bench_script("bench_gemm_in_model")
    q8, q4 = mod.label("linear", 8, 4096, 1024), mod.label("linear", 4, 4096, 1024)
    gate = mod.label("fused_gate_up_silu", 16, 6144, 1024)
    assert mod.label_key(q8) == mod.label_key(q4) == ("decode", 4096, 1024, False)
    assert mod.label_key(gate) == ("decode16", 3072, 1024, True)
    assert mod.label_key("aten::mm") is None
    times = {
        q8: {"cublas": [10.0], "cutile": [10.0, 10.0], "cand1": [8.0], "cand2": [12.5]},
        q4: {"cublas": [10.0], "cutile": [10.0], "cand1": [12.5], "cand2": [8.0]},
        gate: {"cublas": [10.0], "cutile": [9.0], "cand1": [5.0], "cand2": [1.0]},
        mod.label("linear", 1, 64, 64): {"cublas": [1.0], "cutile": [1.0]},  # no cand1 run
    }
    ranks = {("decode", 4096, 1024, False): 2, ("decode16", 3072, 1024, True): 1}
    ranks[("single", 64, 64, False)] = 1
    picks = mod.pick_in_model(times, ranks)
    assert set(picks) == {("decode", 4096, 1024, False), ("decode16", 3072, 1024, True)}
    best, pct = picks[("decode", 4096, 1024, False)]
    assert best == "cutile" and pct["cutile"] == pytest.approx(100.0)
    assert pct["cand1"] == pytest.approx(100.0) and pct["cand2"] == pytest.approx(100.0)
    best, pct = picks[("decode16", 3072, 1024, True)]
    assert best == "cand1" and set(pct) == {"cutile", "cand1"}  # cand2 is not its config
    assert pct["cand1"] == pytest.approx(200.0)
    short = {
        ("decode", 4096, 1024, False): [TileConfig(8, 64, 512, swap=True), TileConfig(16, 64, 64)],
        ("decode16", 3072, 1024, True): [TileConfig(16, 64, 256, swap=True)],
    }
    lines, winners = mod.tuning_report(picks, short)
    assert winners == {
        "decode16|3072|1024|True": [16, 64, 256, 1, 0, True, "cta", 0, 0, False] + [False, True]
    }
    assert lines[1] == (
        "decode16|3072|1024|True: table 111.1%, swap-16x64x256/s1 200.0% -> swap-16x64x256/s1"
    )
    assert lines[0].endswith("-> table")


def test_in_model_all_candidates_cover_the_keys_of_the_chosen_buckets():
    """--candidates all: one list per key of the calls in the chosen buckets, merged over the
    key's M values without repeats, without the table's own config."""
    mod = _bench_script("bench_gemm_in_model")
    calls = {
        ("linear", 256, 3072, 2048),
        ("linear", 512, 3072, 2048),
        ("linear", 8, 3072, 2048),
        ("fused_gate_up_silu", 32, 16384, 2048),
    }
    short = mod.all_candidates(calls, top=500, buckets=("small", "medium"))
    assert set(short) == {("medium", 3072, 2048, False), ("small", 8192, 2048, True)}
    medium = short[("medium", 3072, 2048, False)]
    table, want = choose_config(256, 3072, 2048), []
    for m in (256, 512):  # one bucket, one table config
        want += [c for c in candidate_configs(m, 3072, 2048) if c != table and c not in want]
    assert medium == want and table not in medium
    gated = short[("small", 8192, 2048, True)]
    assert gated == [c for c in candidate_configs(32, 8192, 2048, gated=True)[1:]]
    assert len(mod.all_candidates(calls, 2, ("medium",))[("medium", 3072, 2048, False)]) == 2
    assert set(mod.all_candidates(calls, 2, ("decode",))) == {("decode", 3072, 2048, False)}


def test_in_model_bench_counts_overlapping_kernels_once():
    """A dependent kernel launched early (PDL) overlaps its primary: the call is the union."""
    mod = _bench_script("bench_gemm_in_model")
    a = mod.label("linear", 1, 4096, 1024)
    kernels = [(7, 100.0, 104.0), (7, 103.0, 105.0), (7, 108.0, 109.0)]
    times, empty = mod.per_call_kernel_us([(a, 7, 99.0, 110.0)], kernels)
    assert times == {a: [6.0]} and empty == 0


def test_in_model_config_override_hits_only_its_key():
    """A candidate side passes its config to the calls of its key and leaves the rest alone."""
    mod = _bench_script("bench_gemm_in_model")
    seen = []

    def linear(x, w, bias=None, *, out=None, config=None):
        seen.append(config)

    cfg = TileConfig(8, 64, 512, swap=True)
    impls = mod._with_configs({"linear": linear}, {("decode", 64, 32, False): cfg})
    impls["linear"](torch.zeros(2, 4, 32), torch.zeros(64, 32))  # M = 8: the key
    impls["linear"](torch.zeros(1, 32), torch.zeros(64, 32))  # M = 1: another key
    assert seen == [cfg, None]


def test_in_model_shortlist_reads_sweeps_and_skips_the_tables_config(tmp_path, capsys):
    mod = _bench_script("bench_gemm_in_model")
    m, n, k = 8, 2048, 2048
    cands = candidate_configs(m, n, k)
    table_cfg = choose_config(m, n, k)
    others = [c for c in cands if c != table_cfg][:3]
    names = [gemm_configs.config_name(c) for c in [table_cfg, *others]]
    row = dict(proj="q", op="linear", M=m, N=n, K=k, cublas_us=10.0)
    row["candidates"] = [[name, 5.0 + i, 1.0] for i, name in enumerate(names)]
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"rows": [row]}))
    short = mod.load_shortlist([str(path)], top=2)
    assert short == {("decode", n, k, False): others[:2]}
    assert mod.load_shortlist([], top=2) == {}
    assert mod.main(["--candidates", str(tmp_path / "missing.json")]) == 2
    assert mod.main(["--top", "0"]) == 2
    assert mod.main(["--candidates", "all", "--buckets", "tiny"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 3 and all(line.startswith("error: ") for line in errors)


def test_gate_up_prefill_bench_variants_and_bad_arguments(capsys):
    """bench_gate_up_prefill: the table's GEMM and fused configs lead their groups, names are
    unique; bad arguments give one error line each."""
    mod = _bench_script("bench_gate_up_prefill")
    v = mod.variants(2048, 8192, 2048)
    names = list(v)
    assert names[0] == "linear " + gemm_configs.config_name(choose_config(2048, 16384, 2048))
    fused = [n for n in names if v[n][0] == "fused"]
    table = choose_config(2048, 8192, 2048, gated=True)
    assert fused[0] == "fused " + gemm_configs.config_name(table) and v[fused[0]][1] is None
    assert [p for p, _ in v.values()].count("unfused") == 1
    argvs = [["--models", "gpt2"], ["--tokens", "x"], ["--tokens", "0"], ["--warmup-shard", "1"]]
    assert [mod.main(a) for a in argvs] == [2, 2, 2, 2]
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 4 and all(line.startswith("error: ") for line in errors)


@pytest.mark.parametrize(
    "argv", [["--models", "gpt2"], ["--batches", "0"], ["--batches", "a"], ["--reps", "0"]]
)
def test_in_model_bench_rejects_bad_arguments(argv, capsys):
    assert _bench_script("bench_gemm_in_model").main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: ")
