"""The gate's aligned twins, on plain signatures (no compiler run)."""

from __future__ import annotations

import cuda.tile as ct
import pytest
import torch
from cuda.tile.compilation import ArrayConstraint, ScalarConstraint

from tilegym.kernel_inventory.aligned import aligned_array, aligned_twin, with_aligned_twins
from tilegym.ops._common import aligned_array_sig, array_sig, signature


def _unit_stride(dtype, strides, **claims) -> ArrayConstraint:
    return ArrayConstraint(
        dtype,
        len(strides),
        index_dtype=ct.int32,
        stride_lower_bound_incl=0,
        alias_groups=(),
        may_alias_internally=False,
        stride_constant=strides,
        **claims,
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, ct.int32])
@pytest.mark.parametrize("ndim", [1, 2, 4])
def test_twin_of_an_any_stride_array_is_the_aligned_one_models_get(dtype, ndim):
    assert aligned_array(array_sig(dtype, ndim)) == aligned_array_sig(dtype, ndim)


def test_one_byte_elements_step_sixteen_elements():
    twin = aligned_array(array_sig(ct.int8, 3))
    assert twin.stride_divisible_by == (16, 16, 1)
    assert twin.base_addr_divisible_by == 16


def test_arrays_without_unit_last_stride_or_already_aligned_are_left_alone():
    strided = array_sig(torch.bfloat16, 2, last_contiguous=False)
    aligned = aligned_array_sig(torch.bfloat16, 2)
    assert aligned_array(strided) is strided
    assert aligned_array(aligned) is aligned
    scalar = ScalarConstraint(ct.int32)
    assert aligned_array(scalar) is scalar


def test_a_fixed_stride_keeps_no_divisibility_claim():
    fixed = _unit_stride(ct.float32, (None, 64, 1))
    twin = aligned_array(fixed)
    assert twin.stride_divisible_by == (4, 1, 1)
    assert twin.stride_constant == (None, 64, 1)


def test_twin_keeps_scalars_and_constants_and_drops_a_declared_symbol():
    import dataclasses

    sig = signature(array_sig(torch.bfloat16, 2), ScalarConstraint(ct.float32), 64)
    sig = dataclasses.replace(sig, symbol="my_kernel_bf16")
    twin = aligned_twin(sig)
    assert twin.parameters[0] == aligned_array_sig(torch.bfloat16, 2)
    assert twin.parameters[1:] == sig.parameters[1:]
    assert twin.symbol is None and sig.symbol == "my_kernel_bf16"


def test_a_signature_with_nothing_to_align_is_its_own_twin():
    sig = signature(aligned_array_sig(torch.float32, 1), 8)
    assert aligned_twin(sig) is sig


def test_twins_follow_their_signatures_once():
    any_bf16 = signature(array_sig(torch.bfloat16, 2), 64)
    any_f16 = signature(array_sig(torch.float16, 2), 64)
    aligned_f16 = signature(aligned_array_sig(torch.float16, 2), 64)
    out = with_aligned_twins({"k": [any_bf16, any_f16, aligned_f16], "j": [aligned_f16]})
    assert out["k"] == [any_bf16, any_f16, aligned_f16, aligned_twin(any_bf16)]
    assert out["j"] == [aligned_f16]


def test_an_aligned_base_with_any_row_stride_gets_a_twin():
    """The attention modules' arrays: 16-byte base, row strides unclaimed (no TMA)."""
    base_only = _unit_stride(ct.bfloat16, (None, None, None, 1), base_addr_divisible_by=16)
    assert aligned_array(base_only) == aligned_array_sig(torch.bfloat16, 4)
