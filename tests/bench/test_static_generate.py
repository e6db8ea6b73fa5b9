"""``benchmarks/e2e/static_generate.py``'s ``--variant`` sides: parsing, the extra patched twin
on the CPU (tiny preset), and the one-line error for a setting the patch does not take."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

E2E = Path(__file__).resolve().parents[2] / "benchmarks/e2e"
SCRIPT = E2E / "static_generate.py"


def _module():
    sys.path.insert(0, str(E2E))
    spec = importlib.util.spec_from_file_location("static_generate", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_variant_is_flags_and_tunings_by_name():
    parse = _module().parse_variant
    assert parse("norm_gemv=1,rope=False") == {"norm_gemv": 1, "rope": False}
    assert parse("rope_heads=2") == {"rope_heads": 2}


@pytest.mark.parametrize(
    "text,message",
    [
        ("bogus=True", r"unknown \['bogus'\]"),
        ("norm_gemv=9", "norm_gemv must be 0, 1 or 2"),
        ("rope=yes", "rope=yes: expected rope=True or rope=False"),
        ("norm_gemv=one", "expected norm_gemv=N"),
    ],
)
def test_a_bad_variant_is_one_error(text, message):
    with pytest.raises(ValueError, match=message):
        _module().parse_variant(text)


def test_the_script_refuses_a_bad_variant_before_any_model():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--variant", "norm_gemv=3"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --variant norm_gemv must be 0, 1 or 2, got 3"
    ]


def _op_calls(model, ids) -> set[str]:
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(input_ids=ids)
    return {e.name for e in prof.events() if e.name.startswith("tilegym::")}


def test_each_variant_is_one_more_patched_twin_on_the_same_weights():
    sys.path.insert(0, str(E2E))
    from _sides import CUTILE, PYTORCH, static_sides, variant_name

    variant = {"norm_gemv": 2}
    _, sides, _ = static_sides(
        "tiny-qwen3", "default", 0, device="cpu", cpu_sized=True, variants=(variant,)
    )
    name = variant_name(variant)
    assert list(sides) == [PYTORCH, CUTILE, name] and name == "cuTile static norm_gemv=2"
    base, twin, other = (sides[k].model for k in sides)
    assert {p.data_ptr() for p in other.parameters()} == {p.data_ptr() for p in base.parameters()}
    ids = torch.randint(0, base.config.vocab_size, (1, 8))
    assert "tilegym::rms_norm_gate_up" not in _op_calls(twin, ids)  # qwen3 ships norm_gemv 1
    calls = _op_calls(other, ids)
    assert {"tilegym::rms_norm_linear", "tilegym::rms_norm_gate_up"} <= calls
