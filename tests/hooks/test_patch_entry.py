"""Which ``MODEL_PATCH_KWARGS`` entry an experiment may change: the model type its preset
benchmarks. ``gemma3`` (folder and preset key) patches model type ``gemma3_text``."""

from __future__ import annotations

from tilegym_hooks.scope_rules import Change, patch_entry, patch_kwargs_finding

PATH = "modeling/transformers/src/tilegym_hf_bench/tilegym_patch.py"
BASE = """MODEL_PATCH_KWARGS = {
    "gemma3_text": {"rms_norm": True},
    "llama": {"rms_norm": True},
}
"""


def _finding(model_key: str, old: str, new: str):
    head = BASE.replace(old, new)
    assert head != BASE
    return patch_kwargs_finding(model_key, Change(PATH, BASE.encode(), head.encode()))


def test_the_entry_is_the_presets_model_type():
    assert patch_entry("gemma3") == "gemma3_text"
    assert patch_entry("qwen3") == "qwen3"
    assert patch_entry("not-a-preset") == "not-a-preset"


def test_a_gemma3_experiment_may_change_the_gemma3_text_entry_only():
    assert _finding("gemma3", '"gemma3_text": {"rms_norm": True}', '"gemma3_text": {}') is None
    finding = _finding("gemma3", '"llama": {"rms_norm": True}', '"llama": {}')
    assert finding.code == "SCOPE003"
    assert finding.message == "changes MODEL_PATCH_KWARGS entries other than 'gemma3_text'"
