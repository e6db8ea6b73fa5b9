"""kernel_times.py: per-call times from a metrics file's kernel table, one line for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.bot.conftest import metrics

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks/e2e/kernel_times.py"

KERNELS = [
    dict(
        name="tilegym_moe_gate_up_kernel_Kt2_A2bf16_I8",
        calls=4,
        gpu_ms=0.064,
        cutile=True,
        module=None,
    ),
    dict(
        name="tilegym_moe_down_kernel_Kt1_A2bf16_I8",
        calls=4,
        gpu_ms=0.032,
        cutile=True,
        module=None,
    ),
    dict(
        name="tilegym_moe_down_kernel_Kt1_A2bf16_I64", calls=1, gpu_ms=0.2, cutile=True, module=None
    ),
    dict(name="nvjet_sm90_tst_128x8", calls=4, gpu_ms=0.5, cutile=False, module=None),
]


def _run(*args):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60
    )


def _metrics(tmp_path, kernels=KERNELS, name="m.json", **kw):
    """A schema-valid metrics file (the bot tests' builder) with these kernel rows."""
    path = tmp_path / name
    path.write_text(json.dumps(metrics(kernels=kernels, **kw)))
    return path


def test_matching_kernels_per_call_and_their_sum(tmp_path):
    done = _run(_metrics(tmp_path), "--match", "tilegym_moe", "--calls", 4)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")][1:]
    assert rows == [
        "| tilegym_moe_gate_up_kernel | yes | 4 | 0.064 | 16.00 |",
        "| tilegym_moe_down_kernel | yes | 4 | 0.032 | 8.00 |",
        "| all 2 above, per call | | 4 | | 24.00 |",
    ]


def test_mixed_call_counts_get_no_sum(tmp_path):
    done = _run(_metrics(tmp_path), "--match", "down")
    assert done.returncode == 0, done.stderr
    assert "| tilegym_moe_down_kernel | yes | 1 | 0.200 | 200.00 |" in done.stdout
    assert "per call" not in done.stdout


def test_bad_inputs_get_one_line(tmp_path):
    no_table = _metrics(tmp_path, name="plain.json", coverage=None)
    done = _run(no_table)
    assert done.returncode == 2
    assert (
        done.stderr
        == f"{no_table}: error: no coverage.kernels table (a run without the profile?)\n"
    )
    bad_row = _metrics(tmp_path, [{"name": "k", "calls": -1, "gpu_ms": 1.0}], "bad.json")
    assert _run(bad_row).stderr.startswith(
        f"{bad_row}: error: not a bench metrics file: $.coverage"
    )
    assert _run(_metrics(tmp_path), "--match", "nothing_like_this").returncode == 1
    bad_regex = _run(_metrics(tmp_path), "--match", "(")
    assert bad_regex.returncode == 2 and bad_regex.stderr.startswith("error: --match '(':")
