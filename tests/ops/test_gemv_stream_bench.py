"""``benchmarks/ops/bench_gemv_stream.py``'s CPU side: a layer's projections, the configs each
projection times (the table's first, GEMV tiles only where the GEMV kernel runs the op), and
the one-line error without a GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from bench_scripts import BENCH, load_bench

from tilegym.ops.gemm_configs import choose_config


@pytest.fixture(scope="module")
def stream():
    return load_bench("bench_gemv_stream")


def test_olmo3_layer_projections(stream):
    assert tuple(stream.projections("olmo3")) == stream.PROJECTIONS
    assert stream.projections("olmo3") == {
        "qkv": ("linear", 12288, 4096),
        "o_proj": ("residual", 4096, 4096),
        "gate_up": ("gated", 11008, 4096),
        "down": ("residual", 4096, 11008),
    }


@pytest.mark.parametrize("which", ["table", "gemv", "all"])
@pytest.mark.parametrize("proj", ["qkv", "gate_up", "down"])
def test_configs_start_with_the_table_choice(stream, which, proj):
    op, n, k = stream.projections("olmo3")[proj]
    cfgs = stream.configs(op, n, k, which)
    assert cfgs[0] == choose_config(1, n, k, gated=op == "gated")
    assert len(cfgs) == len(set(cfgs))
    if which == "table":
        assert len(cfgs) == 1
    if which == "gemv" and op == "gated":  # swapped mma tiles and the gate/up GEMV's
        assert {c.swap for c in cfgs[1:]} == {True, False}
        assert all(c.swap or c.gemv for c in cfgs[1:])
    if which == "gemv" and op != "gated":
        gemv = [c for c in cfgs[1:] if c.gemv]
        assert len(gemv) == len(cfgs) - 1
        assert {c.occupancy for c in gemv} == {0, 6, 8}


def test_every_model_names_a_head_width_that_splits_its_projections(stream):
    """The QKV RoPE probes take q's and kv's head counts from ``head``."""
    for name, c in stream.MODELS.items():
        assert c["q"] % c["head"] == 0 and c["kv"] % c["head"] == 0, name
        assert c["head"] % 4 == 0, name  # two halves of whole 2-row GEMV tiles


def test_rope_tables_are_one_position_with_equal_halves(stream):
    cos, sin = stream.rope_tables(64, device="cpu")
    assert cos.shape == sin.shape == (1, 64) and cos.dtype == torch.bfloat16
    assert torch.equal(cos[:, :32], cos[:, 32:]) and torch.equal(sin[:, :32], sin[:, 32:])
    assert cos[0, 0] == torch.tensor(stream.ROPE_POSITION, dtype=torch.float64).cos().bfloat16()
    torch.testing.assert_close(
        cos.float() ** 2 + sin.float() ** 2, torch.ones(1, 64), atol=1e-2, rtol=0
    )


def test_without_a_gpu_one_error_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the error path is the one without a GPU")
    run = subprocess.run(
        [sys.executable, str(BENCH / "bench_gemv_stream.py"), "--json-out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == ["error: bench_gemv_stream.py needs a CUDA GPU"]
    assert not list(tmp_path.iterdir())


def _rec(variant, cfg, us, lo, hi, n=4096, k=4096, op="residual"):
    return dict(
        model="olmo3",
        proj="p",
        op=op,
        N=n,
        K=k,
        variant=variant,
        config=cfg,
        us=us,
        min_us=lo,
        max_us=hi,
    )


def test_winner_only_beyond_the_spread(stream):
    from tilegym.ops.gemm_configs import TileConfig

    table = TileConfig(8, 64, 512, swap=True)
    fast = TileConfig(1, 4, 1024, occupancy=2, gemv=True)
    rows = [
        _rec("gemv fast", fast, 15.0, 14.8, 15.4),
        _rec("cuBLAS", None, 16, 15, 17),
        _rec("table swap", table, 17.0, 16.0, 18.0),
    ]
    assert stream.winner(rows) == fast
    overlapping = [dict(rows[0], max_us=16.5), *rows[1:]]
    assert stream.winner(overlapping) is None
    table_first = [rows[2], rows[0]]
    assert stream.winner(table_first) is None
    assert stream.winner([rows[1], _rec("table swap", table, 17, 16, 18)]) is None


def test_tuned_table_puts_winners_under_their_keys(stream):
    from tilegym.ops.gemm_configs import TileConfig, parse_table, table_doc

    fast = TileConfig(1, 8, 1024, occupancy=4, gemv=True)
    swap = TileConfig(8, 64, 256, occupancy=2, swap=True)
    rows = [_rec("gemv", fast, 15, 14.8, 15.2), _rec("table x", swap, 17, 16, 18)]
    gated = [
        _rec("swap", swap, 50, 49, 51, 11008, 4096, "gated"),
        _rec("table y", TileConfig(8, 64, 256, swap=True), 51, 50.5, 52, 11008, 4096, "gated"),
    ]
    doc = stream.tuned_table(rows + [dict(r, proj="g") for r in gated])
    shipped = table_doc()
    changed = {key for key in doc if doc[key] != shipped.get(key)}
    assert changed == {"single|4096|4096|False"}
    assert parse_table(doc)[("single", 4096, 4096, False)] == fast


def test_the_gpu_check_selects_the_gemv_tests():
    """``gpu_check_gemv.sh``'s pytest selection (its ``-k``) collects the GEMV GPU tests of
    both kernels and the hinted tiles (a typo would run none and pass)."""
    script = (BENCH / "gpu_check_gemv.sh").read_text()
    assert "tests/ops/test_gemm.py \\\n    -m gpu -k gemv " in script
    root = BENCH.parents[1]
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    result = subprocess.run(
        [*cmd, "tests/ops/test_gemm.py", "-m", "gpu", "-k", "gemv"],
        cwd=root, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    ids = [line for line in result.stdout.splitlines() if "::" in line]
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert any("gated" in i and "O8" in i for i in ids)
    assert any("pdl_waits" in i and "gated" in i for i in ids)


@pytest.mark.parametrize(
    ("args", "named"), [(["--models", "olmo9"], "olmo9"), (["--projs", "qkv,lm"], "'lm'")]
)
def test_unknown_model_or_projection_is_one_error_line(stream, capsys, args, named):
    assert stream.main(args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: unknown ") and named in line


def test_the_rope_gemv_check_selects_its_tests():
    """``gpu_check_rope_gemv.sh``'s ``-k`` collects the fused kernel's GPU tests (its cache
    write and captured graph too, OLMo's whole-projection norms), the norm gate/up GEMV's
    (their shared K loop), the post-norm gate/up GEMV's, and llama's, qwen3's and olmo3's
    Solution parity (a typo would run none)."""
    script = (BENCH / "gpu_check_rope_gemv.sh").read_text()
    (line,) = [s for s in script.splitlines() if s.startswith("TESTS=")]
    selection = line.partition("=")[2].strip('"')
    files = [
        "tests/ops/test_rms_norm_linear_rope.py",
        "tests/ops/test_rms_norm_linear.py",
        "tests/ops/test_add_norm_gate_up.py",
        "tests/transformers/test_kernel_inventory.py",
    ]
    assert all(f in script for f in files)
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    result = subprocess.run(
        [*cmd, *files, "-m", "gpu", "-k", selection],
        cwd=BENCH.parents[1], capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    ids = [line for line in result.stdout.splitlines() if "::" in line]
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert any("test_norm_rope_gemv_matches_fp64" in i for i in ids)
    assert any("test_norm_gate_up_matches_fp64" in i for i in ids)
    assert any("llama_rms_norm_linear_rope_qkv" in i for i in ids)
    assert any("qwen3_rms_norm_linear_qk_norm_rope" in i for i in ids)
    assert any("test_head_norms_match_fp64" in i for i in ids)
    assert any(
        "test_cache_write_puts_the_outputs_keys_and_values_at_the_position" in i for i in ids
    )
    assert any("test_head_norms_in_a_captured_graph_use_the_reserved_counters" in i for i in ids)
    assert any("test_whole_projection_norms_match_fp64" in i for i in ids)
    assert any("test_matches_fp64_and_stores_the_sum_as_rms_norm_add" in i for i in ids)
    assert any("test_pdl_waits_for_the_kernel_writing_the_branch" in i for i in ids)
    assert any("olmo3_linear_qk_norm_whole_rope" in i for i in ids)
    assert any("olmo3_post_norm_add_gate_up_silu" in i for i in ids)
