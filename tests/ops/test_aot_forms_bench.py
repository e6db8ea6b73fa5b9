"""``benchmarks/ops/aot_forms.py`` on the CPU: a declared form and its aligned twin, compiled."""

from __future__ import annotations

import pytest
from bench_scripts import load_bench

from tilegym.kernel_inventory.compile import toolchain_problem


@pytest.mark.slow
def test_prints_the_declared_form_and_its_twin(capsys):
    if toolchain_problem():
        pytest.skip(toolchain_problem())
    bench = load_bench("aot_forms")
    assert bench.main(["--modules", "silu_and_mul"]) == 0
    [row] = [line for line in capsys.readouterr().out.splitlines() if "silu_and_mul" in line]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[:2] == ["silu_and_mul", "`silu_and_mul_kernel`"]
    declared, twin = int(cells[2]), int(cells[5])
    assert 0 < declared <= 255 and 0 < twin <= 255
    assert cells[4] == cells[7] == "0 / 0"
