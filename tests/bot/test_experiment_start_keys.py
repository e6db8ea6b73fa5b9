"""``experiment start`` takes only a model key the benchmark has a preset for and the cuTile
patch has flags for; any other key is refused in one line that lists the known keys and says
how to add a model, before anything is written. Real git repositories, the bot as a CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tilegym_bot.cli import main
from tilegym_bot.experiment import known_model_keys
from tilegym_hf_bench.presets import PRESETS
from tilegym_hf_bench.tilegym_patch import MODEL_PATCH_KWARGS


def _state(r):
    """Everything ``start`` could change: refs, HEAD, the working tree, sandbox and bot state."""
    files = [Path(r.working_tree_dir, "sandbox"), Path(r.git_dir, "tilegym-bot")]
    return (
        r.git.show_ref(),
        r.git.symbolic_ref("HEAD"),
        r.git.status("--porcelain", "--ignored"),
        sorted(str(p) for base in files if base.exists() for p in base.rglob("*")),
    )


def _expected_keys() -> list[str]:
    return sorted(
        k for k, p in PRESETS.items() if "-" not in k and p.model_type in MODEL_PATCH_KWARGS
    )


def test_the_known_keys_are_the_presets_with_patch_flags():
    keys = known_model_keys()
    assert sorted(k for k, why in keys.items() if why is None) == _expected_keys()
    assert {"qwen3", "llama"} <= set(_expected_keys())
    assert "tiny-qwen3" not in keys  # a CPU-sized benchmark preset, not an experiment's model


@pytest.mark.parametrize("key", ["qwen4", "falcon", "tiny_qwen3"])
def test_an_unknown_model_key_is_refused_in_one_line_before_anything_is_written(repo, capsys, key):
    before = _state(repo)
    capsys.readouterr()
    code = main(["-C", repo.working_tree_dir, "experiment", "start", "--model-key", key,
                 "--name", "x"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err == [
        f"error: model key {key!r} has no benchmark preset; known model keys: "
        f"{', '.join(_expected_keys())}; to add a model, give it a preset in "
        "modeling/transformers/src/tilegym_hf_bench/presets.py (its config in configs/) and its "
        "patch flags in MODEL_PATCH_KWARGS of "
        "modeling/transformers/src/tilegym_hf_bench/tilegym_patch.py, on main"
    ]
    assert _state(repo) == before
    assert [h.name for h in repo.heads] == ["main"]


def test_a_known_model_key_starts_the_experiment(repo, capsys):
    assert main(["-C", repo.working_tree_dir, "experiment", "start", "--model-key", "llama",
                 "--name", "fused-rope"]) == 0  # fmt: skip
    assert repo.active_branch.name == "experiment/llama/fused-rope"


def test_the_refusal_is_one_line_and_no_traceback_from_the_command(repo):
    proc = subprocess.run(
        [sys.executable, "-m", "tilegym_bot", "-C", repo.working_tree_dir, "experiment", "start",
         "--model-key", "qwen4", "--name", "x"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: model key 'qwen4' has no benchmark preset; known model keys: ")
