"""The gpt-oss kernel tables' CPU side (``benchmarks/ops/bench_attention_sinks.py`` and
``bench_moe_bias.py``): argument checks, the rows and their formatting, the weight-read floor's
arithmetic on plain numbers, and the baselines computing what the kernels compute (SDPA with
the sink as a zero key, transformers' eager attention and experts) on small fp32 inputs."""

from __future__ import annotations

import sys

import pytest
import torch
from bench_scripts import BENCH, load_bench


@pytest.fixture(scope="module")
def att():
    return load_bench("bench_attention_sinks")


@pytest.fixture(scope="module")
def moe():
    return load_bench("bench_moe_bias")


def _stats(**medians):
    sys.path.insert(0, str(BENCH))
    try:
        from _timing import summarize
    finally:
        sys.path.remove(str(BENCH))
    return {k: summarize([v * 0.9, v, v * 1.2]) for k, v in medians.items()}


# ------------------------------------------------------------------ attention with sinks


def test_attention_arguments_and_their_errors(att, capsys):
    args = att.parse_args(["--lengths", "128,8192", "--windows", "full,128", "--sinks", "off"])
    assert args.lengths == [128, 8192] and args.windows == [None, 128] and args.sinks == [False]
    assert args.iters == 30 and args.batches == [1, 8]
    for bad in (
        ["--lengths", "0"],
        ["--lengths", "a,2"],
        ["--windows", "half"],
        ["--sinks", "maybe"],
        ["--iters", "3,4"],
    ):
        with pytest.raises(SystemExit):
            att.parse_args(bad)
        assert "error: " in capsys.readouterr().err.strip().splitlines()[-1]


def test_attention_cases_skip_windows_no_longer_than_the_cache(att):
    got = att.cases([128, 512], [1], [None, 128], [True])
    assert got == [(1, 128, None, True), (1, 512, None, True), (1, 512, 128, True)]


def test_attention_row_fits_its_header_and_reads_the_window_only(att):
    st = _stats(eager=30.0, sdpa=12.0, flash=8.0, tile=10.0, other=6.0)
    row, rec = att.table_row((8, 4096, 128, True), st, 3e-3)
    assert len(row) == len(att.HEADER)
    col = {h: row[i] for i, h in enumerate(att.HEADER)}
    assert col["other us"] == 6.0 and rec["other_us"] == 6.0
    assert col["vs eager"] == "3.00x" and col["vs sdpa"] == "1.20x" and col["window"] == 128
    assert col["flash us"] == 8.0 and col["vs flash"] == "0.80x" and rec["flash_us"] == 8.0
    # 128 keys of 8 heads x 64, keys and values, bf16, batch 8: 2 * 8 * 8 * 128 * 64 * 2 bytes
    assert col["tile GB/s"] == pytest.approx(2 * 8 * 8 * 128 * 64 * 2 / 10.0 / 1e3)
    assert rec["tile_us"] == 10.0 and rec["sinks"] is True and rec["err"] == 3e-3
    off = {k: v for k, v in st.items() if k not in ("flash", "other")}  # SDPA is flash's call
    row, _ = att.table_row((1, 256, None, False), off, 0.5)
    assert row[att.HEADER.index("other us")] == row[att.HEADER.index("tile us")]
    assert row[-1].endswith("FAIL") and row[2] == "full" and row[3] == "off"
    assert row[att.HEADER.index("vs flash")] == row[att.HEADER.index("vs sdpa")] == "1.20x"


def test_attention_baselines_compute_attention_with_sinks(att):
    """SDPA with the zero key and the sink column, and gpt-oss's eager attention, equal the
    fp32 reference with sinks; Llama's eager attention the reference without (CPU, fp32)."""
    from tilegym.ops.attention import reference_mask
    from tilegym.ops.attention_sinks import reference_attention_sinks

    torch.manual_seed(0)
    b, hq, hkv, n, d = 3, 8, 2, 37, 64
    q, k, v = torch.randn(b, hq, 1, d), torch.randn(b, hkv, n, d), torch.randn(b, hkv, n, d)
    sinks = torch.randn(hq) * 2
    mask = reference_mask(b, 1, n, q_start=n - 1)
    want = reference_attention_sinks(q, k, v, mask, sinks, att.SCALE)
    ks, vs, add = att.sdpa_sink_inputs(k, v, sinks, hq)
    torch.testing.assert_close(att.sdpa(q, ks, vs, add).transpose(1, 2), want)
    torch.testing.assert_close(att.eager(q, k, v, sinks), want)
    plain = reference_attention_sinks(q, k, v, mask, torch.full((hq,), -torch.inf), att.SCALE)
    torch.testing.assert_close(att.eager(q, k, v, None), plain)
    torch.testing.assert_close(att.sdpa(q, k, v).transpose(1, 2), plain)
    assert (want - plain).abs().max() > 1e-2  # the sinks matter at these values


def test_attention_bench_without_a_gpu_says_so(att, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert att.main(["--lengths", "128"]) == 1
    assert capsys.readouterr().err.strip() == (
        "error: bench_attention_sinks times CUDA kernels; no CUDA GPU here"
    )


# ------------------------------------------------------------------ experts


def test_floor_arithmetic_on_plain_numbers(moe):
    # one gpt-oss-20b expert: 2880 x 5760 + 5760 + 2880 x 2880 + 2880 parameters, 2 bytes
    assert moe.expert_bytes(2880, 2880) == (16_588_800 + 5_760 + 8_294_400 + 2_880) * 2
    assert moe.expert_bytes(4, 3, elem=1) == 4 * 6 + 6 + 3 * 4 + 4
    # 4 experts (T = 1) at 4.8 TB/s: 199,134,720 bytes in 41.49 us
    assert moe.floor_us(4, 2880, 2880, 4.8) == pytest.approx(199_134_720 / 4.8e12 * 1e6)
    assert moe.floor_us(4, 2880, 2880, 4.8) == pytest.approx(41.486, abs=1e-3)
    assert moe.floor_us(8, 2880, 2880, 2.4) == pytest.approx(4 * moe.floor_us(4, 2880, 2880, 4.8))


def test_experts_row_fits_its_header_and_says_how_far_from_the_floor(moe):
    st = _stats(torch=200.0, cutile=80.0)
    row, rec = moe.table_row(1, "graph", 4, "grouped_mm", st, 40.0, 1e-3)
    assert len(row) == len(moe.HEADER)
    col = {h: row[i] for i, h in enumerate(moe.HEADER)}
    assert col["speedup"] == "2.50x" and col["x floor"] == "2.00x" and col["err"] == "1.0e-03"
    assert rec["x_floor"] == 2.0 and rec["active_experts"] == 4
    row, _ = moe.table_row(8, "eager", 20, "eager", st, 100.0, 0.1)
    assert row[-1].endswith("FAIL")


def test_experts_arguments_and_their_errors(moe, capsys):
    args = moe.parse_args(["--tokens", "1,8", "--tbps", "3.35", "--iters", "7"])
    assert args.tokens == [1, 8] and args.tbps == 3.35 and args.iters == 7
    assert moe.parse_args([]).tbps is None  # the running GPU's own bandwidth
    for bad in (["--tokens", "-1"], ["--tbps", "0"], ["--tbps", "fast"], ["--iters", "x"]):
        with pytest.raises(SystemExit):
            moe.parse_args(bad)
        assert "error: " in capsys.readouterr().err.strip().splitlines()[-1]


def test_router_is_gpt_oss_softmax_over_the_top_k(moe):
    logits = torch.tensor([[0.5, 3.0, -1.0, 2.0, 1.0]])
    weights, ids = moe.route(logits, 2)
    assert ids.tolist() == [[1, 3]]
    torch.testing.assert_close(weights, torch.softmax(torch.tensor([[3.0, 2.0]]), -1))


@pytest.mark.parametrize("impl", ["eager", "default"])
def test_transformers_experts_baseline_computes_the_kernels_reference(moe, impl):
    """The baseline module on gpt-oss's layout and the cuTile reference on the relaid rows
    agree (fp32, odd sizes), the clamp binding: the table compares the same computation."""
    from tilegym.ops import moe_bias

    if impl == "default":
        impl, _ = moe.transformers_default()
    gen = torch.Generator().manual_seed(3)
    shape = {"hidden": 48, "inter": 40, "experts": 6, "top_k": 4}
    x, gu, gub, down, db, weights, ids = moe.experts_inputs(7, shape, "cpu", torch.float32, gen)
    module = moe.experts_module(impl, gu, gub, down, db)
    with torch.no_grad():
        got = module(x, ids, weights)
        gate_up = torch.einsum("th,ehi->tei", x, gu) + gub
    assert (gate_up[..., ::2] > 7).any() and (gate_up[..., 1::2].abs() > 7).any()
    rows = moe_bias.expert_rows(gu, gub, down, db)
    want = moe_bias.moe_experts_bias_reference(x, ids.to(torch.int32), weights, *rows)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
