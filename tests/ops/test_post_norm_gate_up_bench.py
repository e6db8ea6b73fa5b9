"""``benchmarks/ops/bench_post_norm_gate_up.py``'s CPU side: the ``--tile`` parser, the
one-line errors, and the shapes it times (OLMo 3 7B's and OLMo 2 1B's MLPs)."""

from __future__ import annotations

import pytest
from bench_scripts import load_bench

from tilegym.ops.gemm_configs import TileConfig


@pytest.fixture(scope="module")
def bench():
    return load_bench("bench_post_norm_gate_up")


def test_tiles_parse_with_and_without_an_occupancy(bench):
    assert bench.parse_tile("2,512,8") == TileConfig(1, 2, 512, gemv=True, occupancy=8)
    assert bench.parse_tile("4,1024") == TileConfig(1, 4, 1024, gemv=True)


@pytest.mark.parametrize("text", ["2", "2,512,8,1", "0,512", "a,512", "2,-512", "3,512"])
def test_a_bad_tile_is_one_error_line(bench, text, capsys):
    assert bench.main(["--tile", text]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: --tile") and text in line


def test_the_shapes_are_the_post_norm_presets_mlps(bench):
    from tilegym_hf_bench.presets import PRESETS, config_dict

    for model, (hidden, inter) in bench.SHAPES.items():
        config = config_dict(PRESETS[model])
        assert (config["hidden_size"], config["intermediate_size"]) == (hidden, inter)
