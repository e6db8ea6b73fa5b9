"""tileiras' remarks: the library's GEMM kernels put every ``mma`` on Hopper's tensor cores.

The parser is checked on tileiras' own output; the builds need the toolchain (no GPU). A
negative control, the MoE gate-up GEMM as it was before its rows were pre-gathered (hidden rows
gathered into registers, 32-row weight tiles), is reported as scalar FMAs, so the check can
fail."""

from __future__ import annotations

import functools
import inspect
import re

import pytest

from tilegym.kernel_inventory.remarks import Remark, parse_remarks, scalar_mmas

ct = pytest.importorskip("cuda.tile")

SAMPLE = """\
in function: k_A2bf16:

  category: Tensor-core
    remark[passed]: MMA operation successfully optimized to use Tensor Cores
      --> "/src/tilegym/ops/moe.py":280:15
       |
       = name: RemarkTensorCoreMMA
       = note: Instruction = Tensor-core SM90
       = note: Shape = [64, 8, 16]

    remark[failed]: MMA operation failed to optimize to use Tensor Cores
      --> "/src/tilegym/ops/moe.py":280:15
       |
       = name: RemarkTensorCoreMMA
       = note: Instruction = FMA
       = note: Shape = [1, 1, 1]

  category: Memory
    remark[passed]: Load instruction selected
      --> "/src/x.py":19:16
       = name: RemarkMemoryLoadInstructionSelected
       = note: Instruction = TMA Load instruction
"""


def test_parse_remarks_reads_category_status_location_and_notes():
    remarks = parse_remarks(SAMPLE)
    assert [(r.category, r.status, r.instruction) for r in remarks] == [
        ("Tensor-core", "passed", "Tensor-core SM90"),
        ("Tensor-core", "failed", "FMA"),
        ("Memory", "passed", "TMA Load instruction"),
    ]
    assert remarks[0].location == '"/src/tilegym/ops/moe.py":280:15'
    assert remarks[0].name == "RemarkTensorCoreMMA"
    assert remarks[0].notes["Shape"] == "[64, 8, 16]"
    assert scalar_mmas(remarks) == [remarks[1]]
    assert parse_remarks("") == [] and scalar_mmas([Remark("Memory", "failed", "x")]) == []


def _toolchain():
    from tilegym.kernel_inventory.compile import toolchain_problem

    if toolchain_problem():
        pytest.skip(toolchain_problem())


@functools.cache
def _gemm_kernels() -> dict[str, tuple]:
    """``{label: (kernel, signatures)}`` of every kernel of the GEMM and MoE libraries whose
    body calls an ``mma`` (directly or through a helper), at the signatures they declare for
    AOT compiles: all of the MoE GEMMs' (each builds in under a second), the first and last of
    the linear GEMMs' (their first build takes 5-20 s, 84 of them about 200 s)."""
    from tilegym.ops import gemm, moe

    out = {}
    for lib, sigs in (("gemm", gemm.aot_signatures()), ("moe", moe.aot_signatures())):
        for kernel, signatures in sigs.items():
            if not _calls_mma(kernel._pyfunc):
                continue
            label = f"{lib}:{kernel._pyfunc.__name__}"
            while label in out:  # the same function under other compiler hints
                label += "+"
            out[label] = (kernel, signatures if lib == "moe" else [signatures[0], signatures[-1]])
    return out


def _calls_mma(fn, depth: int = 3) -> bool:
    """Whether ``fn`` calls an ``mma``, itself or through the module's helpers it calls."""
    source = inspect.getsource(fn)
    if re.search(r"\bmma\(", source) or depth == 0:
        return bool(re.search(r"\bmma\(", source))
    called = set(re.findall(r"\b(\w+)\(", source)) - {fn.__name__}
    helpers = [fn.__globals__.get(name) for name in called]
    return any(inspect.isfunction(h) and _calls_mma(h, depth - 1) for h in helpers)


GEMM_KERNELS = [
    "gemm:tilegym_linear_kernel",
    "gemm:tilegym_linear_persistent_kernel",
    "gemm:tilegym_linear_kernel+",
    "gemm:tilegym_gate_up_silu_kernel",
    "gemm:tilegym_gate_up_silu_kernel+",
    "moe:tilegym_moe_gate_up_kernel",
    "moe:tilegym_moe_down_kernel",
    "moe:tilegym_moe_gate_up_kernel+",
    "moe:tilegym_moe_down_kernel+",
]


def test_the_checked_kernels_are_every_gemm_with_an_mma():
    _toolchain()
    assert sorted(_gemm_kernels()) == sorted(GEMM_KERNELS)


@pytest.mark.slow
@pytest.mark.parametrize("label", GEMM_KERNELS)
def test_every_declared_signature_puts_its_mmas_on_tensor_cores_for_sm90(label):
    from tilegym.kernel_inventory.remarks import kernel_remarks

    _toolchain()
    kernel, signatures = _gemm_kernels()[label]
    for sig in signatures:
        remarks = kernel_remarks(kernel, sig, "sm_90")
        mmas = [r for r in remarks if r.category == "Tensor-core"]
        assert mmas and not scalar_mmas(remarks), (label, sig, scalar_mmas(remarks)[:1])
        # wgmma, or at the 16-row decode tiles of the linear GEMMs Ampere's mma.sync
        assert {r.instruction for r in mmas} <= {"Tensor-core SM90", "Tensor-core SM80"}


def test_a_gemm_on_register_gathered_rows_is_reported_as_scalar_fmas():
    from cuda.tile.compilation import ScalarConstraint

    from tilegym.kernel_inventory.remarks import kernel_remarks
    from tilegym.ops._common import aligned_array_sig, signature

    _toolchain()
    a2, a3 = aligned_array_sig(ct.bfloat16, 2), aligned_array_sig(ct.bfloat16, 3)
    i32 = aligned_array_sig(ct.int32, 1)
    sig = signature(a2, i32, a3, a2, ScalarConstraint(ct.int32), 8, 32)
    remarks = kernel_remarks(_gathered_gate_up(), sig, "sm_90")
    assert scalar_mmas(remarks) and all(r.instruction == "FMA" for r in scalar_mmas(remarks))


def _gathered_gate_up():
    """The MoE gate GEMM before its rows were pre-gathered: rows gathered into registers."""
    from tilegym.ops.moe import PAD_ZERO, _acc, _mma, _weight_tile

    @ct.kernel
    def gathered_gate_up(X, Sorted, Wg, A, top_k: int, BM: ct.Constant[int], BN: ct.Constant[int]):
        b, bn = ct.bid(0), ct.bid(1)
        tokens = ct.load(Sorted, (b,), (BM,)) // top_k
        acc = _acc(BM, BN, True)
        for k in range(ct.num_tiles(X, axis=1, shape=(BM, 128))):
            x = ct.load_advanced_indexing(
                X, (tokens, ct.Slice(k * 128, 128)), padding_mode=PAD_ZERO, allow_tma=False
            )
            acc = _mma(x, _weight_tile(Wg, 0, bn, k, BN, 128), acc, True)
        ct.store(A, (b, bn), ct.astype(ct.transpose(acc), A.dtype))

    return gathered_gate_up
