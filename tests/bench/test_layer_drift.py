"""layer_drift.py: per-layer and per-sub-block drift of both bf16 sides from fp32 (tiny MoE
presets on the CPU, a real subprocess each), the numbers on plain tensors, and one line for
bad input."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

E2E = Path(__file__).resolve().parents[2] / "benchmarks/e2e"
SCRIPT = E2E / "layer_drift.py"
#: a decoder layer's rows: the layer and its two sub-blocks teacher-forced, the layer free-running
LAYER_ROWS = [("layer", "forced"), ("self_attn", "forced"), ("mlp", "forced"), ("layer", "free")]


def _drift():
    spec = importlib.util.spec_from_file_location("_drift", E2E / "_drift.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def _run(*args, timeout=300, device="cpu", env=None):
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--device", device, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _rows(tmp_path, *args) -> tuple[list[dict], str]:
    out = tmp_path / "drift.json"
    done = _run(*args, "--json", out)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())["rows"], done.stdout


def _row(rows, layer, block, mode):
    (row,) = [r for r in rows if (r["layer"], r["block"], r["mode"]) == (layer, block, mode)]
    return row


# --- plain tensors -----------------------------------------------------------------------


def test_errors_over_all_tokens_and_over_those_routed_as_fp32():
    d = _drift()
    ref = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])
    out = ref + torch.tensor([[0.1, 0.0], [0.0, 0.0], [0.0, 0.0]])
    real = torch.tensor([True, True, False])  # the third token is padding
    ref_ids = torch.tensor([[0, 1], [2, 3], [0, 1]])
    ids = torch.tensor([[1, 0], [2, 4], [5, 6]])  # same set, a flip, padding (not counted)
    stat = d.side_stat(out, ref, real, ids, ref_ids, ids.float(), ref_ids.float())
    assert stat.err == pytest.approx(0.1 / math.sqrt(5))
    assert stat.max_token_err == pytest.approx(0.1)
    assert stat.flips == 1
    assert stat.err_agreeing == pytest.approx(0.1)  # the first token alone
    assert stat.noise == 1.0  # |4 - 3| on the flipped real token; padding's 5 is not counted
    dense = d.side_stat(out, ref, real)
    assert (dense.flips, dense.err_agreeing, dense.noise) == (None, None, None)


def test_table_and_json_rows():
    d = _drift()
    row = d.Row(1, "mlp", "forced")
    row.sides["pytorch"] = d.SideStat(0.01, 0.02, 2, 0.004, 1e-4)
    row.sides["cutile"] = d.SideStat(0.03, 0.05, 3, 0.002, 2e-4)
    dense = d.Row(None, "logits", "free")
    dense.sides["pytorch"] = d.SideStat(0.0, 0.0)
    dense.sides["cutile"] = d.SideStat(0.01, 0.01)
    header, rule, mlp, logits = d.table_lines([row, dense])
    assert header.count("|") == rule.count("|") == mlp.count("|") == logits.count("|")
    assert mlp.startswith("| 1 | mlp | forced | 1.000e-02 | 3.000e-02 | 3.00 | 2 | 3 |")
    assert "| 0.50 |" in mlp
    assert logits.startswith("| - | logits | free |") and "| inf | - | - |" in logits
    doc = d.row_json(dense)
    assert doc["ratio"] is None and doc["ratio_agreeing"] is None
    assert d.row_json(row)["ratio_agreeing"] == pytest.approx(0.5)
    assert d.non_finite([row, dense]) == []
    dense.sides["cutile"].err = math.nan
    assert d.non_finite([row, dense]) == ["None/logits/free cutile"]


# --- the script on tiny presets ------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "extra", "layers"),
    [
        ("tiny-mixtral", (), 2),
        ("tiny-qwen3_moe", ("--length", 24, "--pad", 8), 2),
        ("tiny-mixtral", ("--layers", 1), 1),
    ],
)
def test_every_layer_and_block_has_a_finite_row_and_cpu_sides_agree(tmp_path, key, extra, layers):
    rows, stdout = _rows(tmp_path, "--model-key", key, *extra)
    expected = [(i, b, m) for i in range(layers) for b, m in LAYER_ROWS]
    expected.append((None, "logits", "free"))
    assert [(r["layer"], r["block"], r["mode"]) for r in rows] == expected
    table = [line for line in stdout.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(expected)  # the header, then a line per row
    for r in rows:
        for stat in r["sides"].values():
            assert stat["err"] is not None and 0 < stat["err"] < 1, r
        moe = r["block"] in ("layer", "mlp")
        assert all((s["flips"] is not None) == moe for s in r["sides"].values()), r
        if r["mode"] == "forced":
            # on a CPU the patched glue runs the ops' PyTorch references: both sides fed the
            # same input round alike (the fp32 MoE reference a little closer to fp32)
            assert 0.5 < r["ratio_agreeing" if moe else "ratio"] < 1.5, r


def test_a_planted_one_percent_moe_error_shows_in_its_layer_only(tmp_path):
    rows, stdout = _rows(tmp_path, "--model-key", "tiny-mixtral", "--plant", "mlp@1=1.01")
    assert "# planted: cuTile side's mlp of layer 1 x 1.01" in stdout
    for block in ("layer", "self_attn", "mlp"):
        row = _row(rows, 0, block, "forced")
        assert row[("ratio_agreeing" if block != "self_attn" else "ratio")] < 1.5, row
    assert _row(rows, 1, "self_attn", "forced")["ratio"] < 1.5
    assert _row(rows, 1, "mlp", "forced")["ratio_agreeing"] > 1.5
    assert _row(rows, 1, "layer", "forced")["ratio_agreeing"] > 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--model-key", "nope"), "error: --model-key 'nope' is not a preset"),
        (("--model-key", "tiny-mixtral", "--length", 0), "error: --length and --layers must be"),
        (("--model-key", "tiny-mixtral", "--layers", 0), "error: --length and --layers must be"),
        (("--model-key", "tiny-mixtral", "--plant", "mlp1=2"), "error: --plant 'mlp1=2':"),
        (("--model-key", "tiny-mixtral", "--plant", "mlp@7=2"), "error: --plant: no 'mlp' in"),
        (
            ("--model-key", "tiny-mixtral", "--patch", "cutile:bogus=True"),
            "error: --patch: no patch flag 'bogus'",
        ),
        (("--model-key", "tiny-mixtral", "--patch", "pytorch"), "error: --patch 'pytorch':"),
    ],
)
def test_bad_input_is_one_error_line(args, message):
    done = _run(*args, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr
    assert done.stdout == ""


def test_cuda_without_a_gpu_is_one_error_line():
    env = os.environ | {"CUDA_VISIBLE_DEVICES": ""}
    done = _run("--model-key", "tiny-mixtral", device="cuda", env=env, timeout=120)
    assert done.returncode == 2
    assert done.stderr == "error: --device cuda: torch sees no CUDA device\n"
