"""AOT compile gate on real tiny cuTile kernels (no GPU needed)."""

from __future__ import annotations

import pytest
from inventory_helpers import KERNEL_PATH, codes_of, make_tree

from tilegym.kernel_inventory.compile import compile_paths, toolchain_problem
from tilegym.kernel_inventory.selection import select_solutions

pytestmark = pytest.mark.skipif(
    toolchain_problem() is not None, reason=f"no cuTile compile toolchain: {toolchain_problem()}"
)

HEADER = """import cuda.tile as ct
import torch
from cuda.tile.compilation import ArrayConstraint, CallingConvention, KernelSignature

TILE = 128


def _array():
    return ArrayConstraint(
        ct.float32, 1, index_dtype=ct.int32, stride_lower_bound_incl=0,
        alias_groups=(), may_alias_internally=False,
    )

"""

GOOD_KERNEL = """
@ct.kernel
def mul_kernel(gate, up, out, TILE: ct.Constant[int]):
    bid = ct.bid(0)
    a = ct.load(gate, index=(bid,), shape=(TILE,))
    b = ct.load(up, index=(bid,), shape=(TILE,))
    ct.store(out, index=(bid,), tile=a * b)

"""

BAD_KERNEL = """
@ct.kernel
def mul_kernel(gate, up, out, TILE: ct.Constant[int]):
    bid = ct.bid(0)
    a = ct.load(gate, index=(bid,), shape=(TILE,))
    ct.store(out, index=(bid,), tile=a * "oops")

"""

EXTRA_KERNEL = """
@ct.kernel
def forgotten_kernel(x, TILE: ct.Constant[int]):
    bid = ct.bid(0)
    ct.store(x, index=(bid,), tile=ct.load(x, index=(bid,), shape=(TILE,)))

"""

ENTRY = """
def silu_and_mul(gate, up):
    out = torch.empty_like(gate)
    grid = (gate.numel() // TILE,)
    ct.launch(torch.cuda.current_stream(), grid, mul_kernel, (gate, up, out, TILE))
    return out

"""

SIGNATURES = """
def aot_signatures():
    signature = KernelSignature(
        [_array(), _array(), _array(), TILE], CallingConvention.cutile_python_v1()
    )
    return {mul_kernel: [signature]}
"""


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEGYM_CACHE_DIR", str(tmp_path / "cache"))


def _tree(tmp_path, source: str):
    root = tmp_path / "repo"
    make_tree(root, kernel_source=source)
    return root


def test_real_kernel_compiles_for_three_architectures_and_is_cached(tmp_path):
    root = _tree(tmp_path, HEADER + GOOD_KERNEL + ENTRY + SIGNATURES)
    assert compile_paths([], root) == []
    cache_file = tmp_path / "cache" / "aot_compiles.json"
    first = cache_file.read_text()
    assert first.count('"gpu_code"') == 3
    for arch in ("sm_90", "sm_100", "sm_120"):
        assert f'"{arch}"' in first
    stamp = cache_file.stat().st_mtime_ns
    assert compile_paths([], root) == []
    assert cache_file.stat().st_mtime_ns == stamp  # all hits: nothing compiled, nothing written


HINTED_SIGNATURES = """
def aot_signatures():
    signature = KernelSignature(
        [_array(), _array(), _array(), TILE], CallingConvention.cutile_python_v1()
    )
    return {mul_kernel: [signature], mul_kernel.replace_hints(occupancy=2): [signature]}
"""


def test_a_variant_with_other_hints_is_compiled_and_cached_on_its_own(tmp_path):
    """Same kernel, same signatures, another occupancy hint: another compile (what launches)."""
    root = _tree(tmp_path, HEADER + GOOD_KERNEL + ENTRY + HINTED_SIGNATURES)
    assert compile_paths([], root) == []
    cached = (tmp_path / "cache" / "aot_compiles.json").read_text()
    assert cached.count('"gpu_code"') == 6  # 3 architectures x 2 variants


def test_type_error_is_one_finding_per_architecture(tmp_path):
    root = _tree(tmp_path, HEADER + BAD_KERNEL + ENTRY + SIGNATURES)
    findings = compile_paths([], root)
    assert codes_of(findings) == ["INV064"] * 3
    messages = sorted(f.message for f in findings)
    assert "SM100 (sm_100)" in messages[0]
    assert all("Unsupported operand types for *" in m for m in messages)
    assert all(f"at {KERNEL_PATH.rsplit('/', 1)[1]}:" in m for m in messages)
    assert all(m.startswith("mul_kernel does not compile for SM") for m in messages)
    assert not (tmp_path / "cache" / "aot_compiles.json").exists()


def test_worker_processes_report_the_same_errors(tmp_path):
    root = _tree(tmp_path, HEADER + BAD_KERNEL + ENTRY + SIGNATURES)
    in_process = compile_paths([], root, use_cache=False)
    in_workers = compile_paths([], root, use_cache=False, jobs=2)
    assert in_workers == in_process and len(in_workers) == 3


@pytest.mark.parametrize(
    ("source", "code", "needle"),
    [
        (HEADER + GOOD_KERNEL + ENTRY, "INV061", "aot_signatures"),
        (HEADER + GOOD_KERNEL + ENTRY + "def aot_signatures():\n    return {}\n", "INV062", "dict"),
        (
            HEADER + GOOD_KERNEL + ENTRY + "def aot_signatures():\n    return {mul_kernel: []}\n",
            "INV062",
            "non-empty list",
        ),
        (
            HEADER + GOOD_KERNEL + ENTRY + "def aot_signatures():\n    raise KeyError('x')\n",
            "INV062",
            "KeyError",
        ),
        ("import no_such_module_anywhere\n" + ENTRY, "INV060", "No module named"),
        ("raise SystemExit(3)\n", "INV060", "SystemExit"),
    ],
)
def test_declaration_problems(tmp_path, source, code, needle):
    findings = compile_paths([], _tree(tmp_path, source))
    assert codes_of(findings) == [code]
    assert needle in findings[0].message


def test_kernel_missing_from_aot_signatures(tmp_path):
    root = _tree(tmp_path, HEADER + GOOD_KERNEL + EXTRA_KERNEL + ENTRY + SIGNATURES)
    findings = compile_paths([], root)
    assert codes_of(findings) == ["INV063"]
    assert "forgotten_kernel" in findings[0].message


def test_paths_select_solutions(tmp_path):
    root = _tree(tmp_path, HEADER + GOOD_KERNEL + ENTRY + SIGNATURES)
    solution = root / "src/tilegym/transformers/qwen3/kernel_solutions/qwen3_silu_and_mul.json"
    definition = root / "src/tilegym/transformers/qwen3/kernel_definitions/qwen3_silu_and_mul.json"
    assert select_solutions([root / KERNEL_PATH], root) == [solution]
    assert select_solutions([definition], root) == [solution]
    assert select_solutions([solution], root) == [solution]
    assert select_solutions([root / "src/other.py"], root) == []


def test_changed_dependency_selects_the_solutions_that_import_it(tmp_path):
    entry = "from tilegym.ops.fake_op import helper\n\n\ndef silu_and_mul(gate, up):\n    pass\n"
    root = _tree(tmp_path, entry)
    ops = root / "src" / "tilegym" / "ops"
    ops.mkdir(parents=True)
    (ops / "__init__.py").write_text("")
    (ops / "fake_op.py").write_text("from . import _shared\n\n\ndef helper():\n    pass\n")
    (ops / "_shared.py").write_text("X = 1\n")
    (ops / "unrelated.py").write_text("Y = 2\n")
    solution = root / "src/tilegym/transformers/qwen3/kernel_solutions/qwen3_silu_and_mul.json"
    assert select_solutions([ops / "fake_op.py"], root) == [solution]
    assert select_solutions([ops / "_shared.py"], root) == [solution]
    assert select_solutions([ops / "unrelated.py"], root) == []


UNIT_STRIDE_SIGNATURES = """
def aot_signatures():
    array = ArrayConstraint(
        ct.float32, 1, index_dtype=ct.int32, stride_lower_bound_incl=0,
        alias_groups=(), may_alias_internally=False, stride_constant=(1,),
    )
    signature = KernelSignature([array, array, array, TILE], CallingConvention.cutile_python_v1())
    return {mul_kernel: [signature]}
"""


def test_the_gate_also_compiles_the_aligned_form_that_models_run(tmp_path):
    from tilegym.kernel_inventory.compile import plan_solution
    from tilegym.kernel_inventory.inventory import load

    root = _tree(tmp_path, HEADER + GOOD_KERNEL + ENTRY + UNIT_STRIDE_SIGNATURES)
    [solution] = select_solutions([], root)
    problems, jobs = plan_solution(load(solution, root), root)
    assert problems == [] and len(jobs) == 3
    for job in jobs:
        declared, twin = job.signatures
        assert [p.base_addr_divisible_by for p in declared.parameters[:3]] == [1, 1, 1]
        assert [p.base_addr_divisible_by for p in twin.parameters[:3]] == [16, 16, 16]
    assert compile_paths([], root) == []
