"""The shared benchmark timing helper's statistics (pure; no GPU)."""

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "ops" / "_timing.py"
_spec = importlib.util.spec_from_file_location("bench_timing", _PATH)
timing = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = timing  # dataclasses resolve their module through sys.modules
_spec.loader.exec_module(timing)


def test_summarize_percentiles():
    st = timing.summarize([float(v) for v in range(1, 12)])  # 1..11
    assert (st.median_us, st.p10_us, st.p90_us, st.n) == (6.0, 2.0, 10.0, 11)
    assert st.spread_pct == pytest.approx(100 * 8 / 6)


def test_summarize_single_sample_and_empty():
    st = timing.summarize([4.0])
    assert st.median_us == st.p10_us == st.p90_us == 4.0
    with pytest.raises(ValueError):
        timing.summarize([])


def test_pooled_groups_samples_by_variant():
    st = timing.pooled({"a#0": [1.0, 2.0], "a#1": [3.0], "b#0": [5.0], "c": [7.0, 9.0]})
    assert set(st) == {"a", "b", "c"}
    assert (st["a"].median_us, st["a"].n) == (2.0, 3)
    assert (st["b"].median_us, st["c"].median_us) == (5.0, 8.0)


def test_bandwidth_helpers():
    st = timing.Stats(median_us=100.0, p10_us=90.0, p90_us=110.0, n=3)
    assert timing.gbps(430_000_000, st) == pytest.approx(4300.0)
    assert timing.pct_of_copy(430_000_000, st, ceiling_tbps=4.3) == pytest.approx(100.0)
    assert timing.pct_of_copy(430_000_000, st, ceiling_tbps=2.15) == pytest.approx(200.0)


def test_format_table_aligns_columns():
    out = timing.format_table(["a", "bb"], [[1.25, "x"], [10.0, "yy"]]).splitlines()
    assert out[0] == "   a  bb" and out[2] == " 1.2   x" and out[3] == "10.0  yy"


def test_hbm_bandwidth_is_the_running_gpus_own():
    assert timing.hbm_tbps("NVIDIA H200") == 4.8
    assert timing.hbm_tbps("NVIDIA H100 80GB HBM3") == 3.35
    assert timing.hbm_tbps("NVIDIA H100 NVL") == 3.9
    assert timing.hbm_tbps("NVIDIA H100 PCIe") == 2.0
    assert timing.hbm_tbps("NVIDIA A10G") is None
