"""The decode timeline's split of GPU time into busy time and idle gaps, from plain data."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks/e2e/decode_timeline.py"


def _module():
    spec = importlib.util.spec_from_file_location("decode_timeline", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_gaps_split_at_the_threshold_and_overlaps_count_once():
    # Two tokens: [a 0-10][b 12-20] ... host 500 µs ... [a 520-530][c 531-540 and d 535-545]
    acts = [
        ("d", 535.0, 10.0),
        ("a", 0.0, 10.0),
        ("b", 12.0, 8.0),
        ("a", 520.0, 10.0),
        ("c", 531.0, 9.0),
    ]
    tl = _module().timeline(acts, tokens=2, gap_us=50.0)
    assert tl.busy_ms == pytest.approx((10 + 8 + 10 + 14) / 2e3)  # c and d overlap: 531-545
    assert tl.inner_gap_ms == pytest.approx((2 + 1) / 2e3)
    assert tl.outer_gap_ms == pytest.approx(500 / 2e3)
    assert tl.after_inner_gap == {"b": (0.5, pytest.approx(1e-3)), "c": (0.5, 5e-4)}


def test_activity_inside_another_leaves_no_gap():
    tl = _module().timeline([("long", 0.0, 100.0), ("short", 10.0, 5.0)], 1, 50.0)
    assert (tl.busy_ms, tl.inner_gap_ms, tl.outer_gap_ms) == (0.1, 0.0, 0.0)


def test_variants_parse_and_bad_ones_are_named():
    parse = _module().parse_variant
    assert parse("pytorch") == ("pytorch", {})
    assert parse("cutile") == ("cutile", {})
    assert parse("cutile:attn=False,rope=True") == ("cutile", {"attn": False, "rope": True})
    for bad in ("torch", "pytorch:attn=False", "cutile:attn", "cutile:attn=0"):
        with pytest.raises(ValueError, match="variant"):
            parse(bad)


def test_only_gpu_activities_of_a_chrome_trace_are_read(tmp_path):
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "k", "ts": 5, "dur": 2},
            {"ph": "X", "cat": "gpu_memcpy", "name": "m", "ts": 9, "dur": 1},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 9},
            {"ph": "i", "cat": "kernel", "name": "instant", "ts": 3},
        ]
    }
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    assert _module().trace_activities(str(path)) == [("k", 5.0, 2.0), ("m", 9.0, 1.0)]


def test_bad_variant_and_a_missing_gpu_get_one_line():
    env = os.environ | {"CUDA_VISIBLE_DEVICES": ""}
    run = [sys.executable, str(SCRIPT)]
    done = subprocess.run([*run, "--variants", "torch"], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "variant 'torch'" in done.stderr
    done = subprocess.run([*run, "--variants", "cutile:bogus=True"], capture_output=True, text=True)
    assert done.returncode == 2 and "no patch flag 'bogus'" in done.stderr
    done = subprocess.run([*run, "--model-key", "nope"], capture_output=True, text=True)
    assert done.returncode == 2 and "--model-key 'nope' is not a preset" in done.stderr
    done = subprocess.run(run, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2 and done.stderr == "error: needs a CUDA GPU\n"
