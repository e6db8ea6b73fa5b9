"""The scripted loops' helpers: the flag edit an experiment makes, and bad usage."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATCH = ROOT / "modeling/transformers/src/tilegym_hf_bench/tilegym_patch.py"
SCRIPT = ROOT / "benchmarks/loop/set_patch_flags.py"


def _module():
    spec = importlib.util.spec_from_file_location("set_patch_flags", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_the_named_entry_changes():
    source = PATCH.read_text()
    edited = _module().set_flags(source, "gemma3_text", {"attn": False, "linear": False})
    changed = [
        (a, b) for a, b in zip(source.splitlines(), edited.splitlines(), strict=True) if a != b
    ]
    assert changed == [
        (
            '    "gemma3_text": {"rope": True, "rms_norm": True, "swiglu": True, "attn": True, '
            '"linear": True},',
            '    "gemma3_text": {"rope": True, "rms_norm": True, "swiglu": True, "attn": False, '
            '"linear": False},',
        )
    ]


def test_unknown_flags_and_model_types_are_errors():
    source = PATCH.read_text()
    with pytest.raises(ValueError, match="unknown flags"):
        _module().set_flags(source, "phi3", {"attention": False})
    with pytest.raises(ValueError, match="no MODEL_PATCH_KWARGS entry for 'gpt2'"):
        _module().set_flags(source, "gpt2", {"attn": False})
    with pytest.raises(ValueError, match="line 2: not Python"):
        _module().set_flags('MODEL_PATCH_KWARGS = {\n  "qwen3": {\n', "qwen3", {"rope": False})


def test_a_tuning_parameter_takes_an_integer_and_joins_the_entry():
    source = PATCH.read_text()
    edited = _module().set_flags(source, "mistral", {"rope_heads": 2})
    # too long for one line: one flag a line, as ruff formats it
    assert (
        '    "mistral": {\n        "rope": True,\n        "rms_norm": True,\n'
        '        "swiglu": True,\n        "attn": True,\n        "linear": True,\n'
        '        "rope_heads": 2,\n    },\n' in edited
    )
    again = _module().set_flags(edited, "mistral", {"rope_heads": 0, "rope": False})
    assert '        "rope": False,\n' in again and '        "rope_heads": 0,\n' in again
    assert again.replace("False", "True").replace(": 0,", ": 2,") == edited
    assert _module().set_flags(source, "phi3", {"attn": False}).count("\n") == source.count("\n")
    with pytest.raises(ValueError, match="rope_heads must be an int in 0..64, got 65"):
        _module().set_flags(source, "qwen3", {"rope_heads": 65})


def test_the_script_rewrites_a_file_in_place_and_reports_bad_input(tmp_path):
    table = tmp_path / "tilegym_patch.py"
    table.write_text(PATCH.read_text())

    def run(*args):
        return subprocess.run(
            [sys.executable, str(SCRIPT), str(table), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert run("qwen3_moe", "rope=False").returncode == 0
    assert '"qwen3_moe": {"rope": False,' in table.read_text()
    bad = run("qwen3_moe", "rope=maybe")
    assert bad.returncode == 2 and bad.stderr.startswith("error: rope=maybe:")
    missing = run("qwen3_moe", "fast=True")
    assert missing.returncode == 1 and missing.stderr.startswith(f"{table}: error: unknown flags")
    assert run("nope", "rope=True").stderr == "error: unknown model key 'nope'\n"
    assert run("qwen3", "rope_heads=2").returncode == 0
    assert '        "rope_heads": 2,\n' in table.read_text()
    for item in ("rope_heads=two", "rope_heads=True", "linear=3"):
        bad = run("qwen3", item)
        assert bad.returncode == 2 and bad.stderr.startswith(f"error: {item}: expected"), item


@pytest.mark.parametrize(
    "script,usage",
    [
        ("family_loop.sh", "OUT_DIR MODEL_KEY [bench args...]"),
        ("speed_loop.sh", "OUT_DIR MODEL_KEY [bench args...]"),
        ("families_on_gpus.sh", "OUT_DIR KEY[,KEY...] [bench args...]"),
    ],
)
def test_the_loop_scripts_need_a_model_key(script, usage):
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks/loop" / script), "out"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr == f"error: usage: {script} {usage}\n"
